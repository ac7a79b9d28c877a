//! Black-box tests of the `ce` binary (one test binary; modules only).

mod cli;
