//! The HTTP router in-process against a real data directory (one test binary; modules only).

mod integration {
    mod common;
    mod console;
    mod fuzz;
    mod kb;
    mod kb_model;
    mod locks;
    mod mcp;
    mod openapi;
    mod sessions;
    mod tenants;
}
