//! The OpenAPI 3.1 document of the HTTP API (`GET /openapi.json`), generated from the
//! route table: every row of [`super::ROUTES`] carries its [`Doc`] (the `routes!` macro
//! does not accept a row without one), and the JSON Schemas of its bodies and answers come
//! from the Rust types themselves (`schemars`). Request bodies are described as the server
//! deserializes them (fields with a default are optional), answers as it serializes them
//! (fields it may leave out are optional). Error answers are the [`ErrorBody`] under the
//! status of each [`ErrorCode`]. Operations served outside the table (mounted services) are
//! listed in [`MOUNTED`].

use std::collections::BTreeSet;
use std::sync::LazyLock;

use axum::Json;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use ce_core::ErrorCode;
use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::auth::Access;
use super::{ROUTES, Route};
use crate::wire::ErrorBody;

/// The JSON Schema of one type, added to a generator's definitions.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema function of `T` (its definition goes to `components.schemas`).
pub const fn schema<T: JsonSchema>() -> SchemaFn {
    SchemaGenerator::subschema_for::<T>
}

/// A query-string parameter. The handlers accept exactly the parameters their operation
/// documents (`handlers::params` takes these lists), so the two cannot disagree.
#[derive(Clone, Copy)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Whether the request must have it.
    pub required: bool,
    /// The type of its value.
    pub schema: SchemaFn,
    /// What it does.
    pub description: &'static str,
}

impl Param {
    /// A required parameter.
    pub const fn required(name: &'static str, schema: SchemaFn, description: &'static str) -> Self {
        Param {
            name,
            required: true,
            schema,
            description,
        }
    }

    /// An optional parameter.
    pub const fn optional(name: &'static str, schema: SchemaFn, description: &'static str) -> Self {
        Param {
            name,
            required: false,
            schema,
            description,
        }
    }
}

/// The success answer of an operation.
#[derive(Clone, Copy)]
pub enum Reply {
    /// 200 with a JSON body of this schema.
    Json(SchemaFn),
    /// 200 with a text body of this media type.
    Text(&'static str),
}

/// The documentation of one operation.
#[derive(Clone, Copy)]
pub struct Doc {
    /// One line.
    pub summary: &'static str,
    /// What else a caller must know (may be empty).
    pub description: &'static str,
    /// The query parameters (none: the route takes no query string).
    pub query: &'static [Param],
    /// The JSON request body, and whether it is required.
    pub body: Option<(SchemaFn, bool)>,
    /// The success answer.
    pub reply: Reply,
    /// Another answer of the operation that is not an [`ErrorBody`] (e.g. `/readyz`'s 503).
    pub other: Option<(u16, &'static str, SchemaFn)>,
}

impl Doc {
    /// An operation named `summary` that answers `reply`, without parameters or body.
    pub const fn new(summary: &'static str, reply: Reply) -> Self {
        Doc {
            summary,
            description: "",
            query: &[],
            body: None,
            reply,
            other: None,
        }
    }

    /// With a description.
    pub const fn describe(mut self, description: &'static str) -> Self {
        self.description = description;
        self
    }

    /// With these query parameters.
    pub const fn query(mut self, query: &'static [Param]) -> Self {
        self.query = query;
        self
    }

    /// With a required JSON body.
    pub const fn body(mut self, body: SchemaFn) -> Self {
        self.body = Some((body, true));
        self
    }

    /// With an optional JSON body (none, or this).
    pub const fn optional_body(mut self, body: SchemaFn) -> Self {
        self.body = Some((body, false));
        self
    }

    /// With another answer that is not an error body.
    pub const fn other(mut self, status: u16, description: &'static str, body: SchemaFn) -> Self {
        self.other = Some((status, description, body));
        self
    }
}

/// The schema of an answer that is an `A` or a `B`.
pub fn any_of<A: JsonSchema, B: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    let (a, b) = (g.subschema_for::<A>(), g.subschema_for::<B>());
    schemars::json_schema!({"anyOf": [a, b]})
}

/// A JSON 200 answer of type `T`.
pub const fn json<T: JsonSchema>() -> Reply {
    Reply::Json(schema::<T>())
}

/// An operation served by the router but not by a row of [`ROUTES`] (a mounted service).
pub struct Mounted {
    /// The method.
    pub method: Method,
    /// The path.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Its operation.
    pub doc: Doc,
}

/// The operations the router serves outside [`ROUTES`]: a service mounted in
/// `super::router` adds its row here, and the route-coverage test
/// (`crates/ce-server/tests/integration/openapi.rs`) checks that every documented operation
/// is served.
pub const MOUNTED: &[Mounted] = &[Mounted {
    method: Method::POST,
    path: crate::mcp::PATH,
    access: Access::Tenant,
    doc: Doc::new(
        "MCP (Model Context Protocol) over Streamable HTTP",
        Reply::Json(json_rpc),
    )
    .describe(
        "One JSON-RPC 2.0 message per request (`initialize`, `tools/list`, `tools/call`, \
         `resources/read`, ...); the tools, their arguments and errors are in docs/mcp.md. \
         Clients of protocol 2025-11-25 keep an `Mcp-Session-Id` (GET opens its event \
         stream, DELETE ends it); 2026-07-28 is stateless. An answer may come as \
         `text/event-stream`. Tested through the official MCP SDKs, not from this document.",
    )
    .body(json_rpc),
}];

/// A JSON-RPC 2.0 message (the MCP endpoint's body and answer).
fn json_rpc(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "type": "object",
        "required": ["jsonrpc"],
        "properties": {"jsonrpc": {"const": "2.0"}}
    })
}

/// The document, built once.
static DOCUMENT: LazyLock<Value> = LazyLock::new(|| document(ROUTES, MOUNTED));

/// `GET /openapi.json`.
pub async fn serve() -> Response {
    Json(&*DOCUMENT).into_response()
}

/// The schema generator of one direction: request bodies as deserialized, answers as
/// serialized; definitions under `#/components/schemas/`.
fn generator(contract: Contract) -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
            s.contract = contract;
        })
        .into_generator()
}

/// The error statuses an operation of `access` with or without a body can answer, each
/// with the codes that have that status.
fn error_statuses(access: Access, has_body: bool) -> Vec<(u16, Vec<&'static str>)> {
    let statuses: BTreeSet<u16> = ErrorCode::ALL.iter().map(|c| c.http_status()).collect();
    statuses
        .into_iter()
        .filter(|s| access != Access::Open || !matches!(s, 401 | 403))
        .filter(|s| has_body || *s != 413)
        .map(|s| {
            let codes = ErrorCode::ALL
                .iter()
                .filter(|c| c.http_status() == s)
                .map(|c| c.as_str())
                .collect();
            (s, codes)
        })
        .collect()
}

/// The path parameters of `path` (`{id}` segments), all strings.
fn path_params(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            json!({
                "name": name, "in": "path", "required": true,
                "schema": {"type": "string", "minLength": 1},
            })
        })
        .collect()
}

/// Who may call an operation, as OpenAPI security requirements.
fn security(access: Access) -> Value {
    match access {
        Access::Open => json!([]),
        Access::Tenant | Access::Admin => json!([{"bearer": []}, {"apiKey": []}]),
    }
}

fn access_note(access: Access) -> &'static str {
    match access {
        Access::Open => "Open: no API key needed.",
        Access::Tenant => {
            "Any API key; a tenant key is scoped to its account and owner spaces (what it may \
             not see answers `not_found`)."
        }
        Access::Admin => "Admin API keys only (a tenant key gets 403 `forbidden`).",
    }
}

/// One operation object.
fn operation(
    method: &Method,
    path: &str,
    access: Access,
    doc: &Doc,
    requests: &mut SchemaGenerator,
    answers: &mut SchemaGenerator,
) -> Value {
    let mut parameters = path_params(path);
    for p in doc.query {
        parameters.push(json!({
            "name": p.name, "in": "query", "required": p.required,
            "description": p.description, "schema": (p.schema)(requests),
        }));
    }
    let mut responses = Map::new();
    let ok = match doc.reply {
        Reply::Json(s) => json!({
            "description": "Success.",
            "content": {"application/json": {"schema": s(answers)}},
        }),
        Reply::Text(media) => json!({
            "description": "Success.",
            "content": {media: {"schema": {"type": "string"}}},
        }),
    };
    responses.insert("200".into(), ok);
    let error = schema::<ErrorBody>()(answers);
    for (status, codes) in error_statuses(access, doc.body.is_some()) {
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("Error: `code` is one of {}.", codes.join(", ")),
                "content": {"application/json": {"schema": error.clone()}},
            }),
        );
    }
    if let Some((status, description, s)) = doc.other {
        responses.insert(
            status.to_string(),
            json!({
                "description": description,
                "content": {"application/json": {"schema": s(answers)}},
            }),
        );
    }
    let description = if doc.description.is_empty() {
        access_note(access).to_owned()
    } else {
        format!("{}\n\n{}", doc.description, access_note(access))
    };
    let mut op = json!({
        "operationId": operation_id(method, path),
        "summary": doc.summary,
        "description": description,
        "security": security(access),
        "parameters": parameters,
        "responses": responses,
    });
    if let Some((s, required)) = doc.body {
        op["requestBody"] = json!({
            "required": required,
            "content": {"application/json": {"schema": s(requests)}},
        });
    }
    op
}

/// `get_v1_jobs_id` for `GET /v1/jobs/{id}`.
fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for part in path.split(|c: char| !c.is_ascii_alphanumeric()) {
        if !part.is_empty() {
            id.push('_');
            id.push_str(part);
        }
    }
    id
}

/// Renames the definitions of `from` whose name `taken` holds with another schema to
/// `{name}Input`, in its definitions and in every `$ref` of `values`.
fn rename_conflicts(
    from: &mut Map<String, Value>,
    taken: &Map<String, Value>,
    values: &mut [&mut Value],
) {
    let renames: Vec<(String, String)> = from
        .iter()
        .filter(|(name, schema)| taken.get(*name).is_some_and(|other| other != *schema))
        .map(|(name, _)| (name.clone(), format!("{name}Input")))
        .collect();
    if renames.is_empty() {
        return;
    }
    fn rewrite(v: &mut Value, renames: &[(String, String)]) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get_mut("$ref") {
                    for (old, new) in renames {
                        if r.strip_prefix("#/components/schemas/") == Some(old) {
                            *r = format!("#/components/schemas/{new}");
                        }
                    }
                }
                m.values_mut().for_each(|v| rewrite(v, renames));
            }
            Value::Array(a) => a.iter_mut().for_each(|v| rewrite(v, renames)),
            _ => {}
        }
    }
    for (old, new) in &renames {
        if let Some(s) = from.remove(old) {
            from.insert(new.clone(), s);
        }
    }
    from.values_mut().for_each(|v| rewrite(v, &renames));
    values.iter_mut().for_each(|v| rewrite(v, &renames));
}

/// The document of `routes` and `mounted`.
pub fn document(routes: &[Route], mounted: &[Mounted]) -> Value {
    let mut requests = generator(Contract::Deserialize);
    let mut answers = generator(Contract::Serialize);
    let ops = routes
        .iter()
        .map(|r| (&r.method, r.path, r.access, &r.doc))
        .chain(
            mounted
                .iter()
                .map(|m| (&m.method, m.path, m.access, &m.doc)),
        );
    // Built per operation, then merged: the request-side schemas may need renaming.
    let mut built: Vec<(&str, String, Value)> = Vec::new();
    for (method, path, access, doc) in ops {
        let op = operation(method, path, access, doc, &mut requests, &mut answers);
        built.push((path, method.as_str().to_ascii_lowercase(), op));
    }
    let answer_defs = answers.take_definitions(true);
    let mut request_defs = requests.take_definitions(true);
    {
        let mut values: Vec<&mut Value> = built.iter_mut().map(|(_, _, op)| op).collect();
        rename_conflicts(&mut request_defs, &answer_defs, &mut values);
    }
    let mut schemas = answer_defs;
    schemas.extend(request_defs);
    let mut paths = Map::new();
    for (path, method, op) in built {
        let item = paths
            .entry(path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ContextEngine HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The JSON API of `ce serve` (docs/http-api.md). Every error \
                answer is `{code, message, retryable}`; a retryable one may carry \
                `Retry-After`. Without `[[server.api_keys]]` every caller is an admin.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                    "description": "`Authorization: Bearer KEY`"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                    "description": "`x-api-key: KEY`"},
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_unique_and_statuses_follow_the_codes() {
        let mut ids = BTreeSet::new();
        for r in ROUTES {
            assert!(ids.insert(operation_id(&r.method, r.path)), "{r:?}");
        }
        assert_eq!(
            operation_id(&Method::GET, "/v1/jobs/{id}"),
            "get_v1_jobs_id"
        );
        let open: Vec<u16> = error_statuses(Access::Open, false)
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert!(!open.contains(&401) && !open.contains(&413) && open.contains(&503));
        let admin = error_statuses(Access::Admin, true);
        let forbidden = admin.iter().find(|(s, _)| *s == 403).expect("403");
        assert_eq!(forbidden.1, ["forbidden"]);
    }

    #[test]
    fn conflicting_request_schemas_are_renamed_everywhere() {
        let mut from = Map::new();
        from.insert("F".into(), json!({"type": "object"}));
        from.insert("Same".into(), json!({"type": "string"}));
        from.insert("Uses".into(), json!({"$ref": "#/components/schemas/F"}));
        let mut taken = Map::new();
        taken.insert("F".into(), json!({"type": "object", "required": ["a"]}));
        taken.insert("Same".into(), json!({"type": "string"}));
        let mut op = json!({"schema": {"$ref": "#/components/schemas/F"}});
        rename_conflicts(&mut from, &taken, &mut [&mut op]);
        assert_eq!(op["schema"]["$ref"], "#/components/schemas/FInput");
        assert_eq!(from["Uses"]["$ref"], "#/components/schemas/FInput");
        assert!(from.contains_key("FInput") && !from.contains_key("F"));
        assert!(from.contains_key("Same"));
    }
}
