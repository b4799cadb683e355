//! The OpenAPI 3 document of a service's routes, from the same descriptors: paths and
//! parameters from the routes, schemas from the messages in their JSON mapping, and
//! descriptions from the protos' comments.

use std::collections::BTreeMap;

use prost_reflect::{DescriptorPool, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor};
use serde_json::{Value, json};

use crate::RouteError;
use crate::routes::{Route, Routes, Segment};

/// The OpenAPI document of `service` in the encoded descriptor set `descriptors`: what
/// [`crate::Gateway`] serves at [`crate::OPENAPI_PATH`].
///
/// # Errors
///
/// As [`crate::Gateway::new`].
pub fn openapi(descriptors: &[u8], service: &str) -> Result<Value, RouteError> {
    let pool = DescriptorPool::decode(descriptors)?;
    let routes = Routes::of(&pool, service)?;
    Ok(document(&routes))
}

/// `value` with every object's keys in order, whether or not serde_json keeps insertion
/// order (its `preserve_order` feature, which another crate of a build may turn on): the
/// document's text is then the same in every build.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(object) => {
            let entries: BTreeMap<String, Value> = object
                .into_iter()
                .map(|(key, value)| (key, sorted(value)))
                .collect();
            Value::Object(entries.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_)) => other,
    }
}

pub(crate) fn document(routes: &Routes) -> Value {
    let mut schemas = Schemas::default();
    let mut paths: BTreeMap<String, serde_json::Map<String, Value>> = BTreeMap::new();
    for route in &routes.routes {
        let operation = operation(route, &mut schemas);
        paths
            .entry(route.template.text.clone())
            .or_default()
            .insert(route.method.as_str().to_ascii_lowercase(), operation);
    }
    let status = json!({
        "type": "object",
        "description": "An error, as google.rpc.Status: its gRPC code, and a message for people.",
        "properties": {
            "code": {"type": "integer", "format": "int32"},
            "message": {"type": "string"},
            "details": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["code", "message"],
    });
    schemas
        .defined
        .insert("google.rpc.Status".to_owned(), status);
    let service = routes
        .routes
        .first()
        .map(|route| route.rpc.parent_service());
    let title = service
        .as_ref()
        .map_or("", |service| service.full_name())
        .to_owned();
    let description = service
        .as_ref()
        .and_then(|service| comments(&service.parent_file(), service.path()))
        .unwrap_or_default();
    sorted(json!({
        "openapi": "3.0.3",
        "info": {
            "title": title,
            "version": "v1",
            "description": description,
        },
        "paths": paths,
        "components": {
            "schemas": schemas.defined,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            },
        },
        // A bearer token when the server has authentication on; none when it is off.
        "security": [{"bearer": []}, {}],
    }))
}

fn operation(route: &Route, schemas: &mut Schemas) -> Value {
    let rpc = &route.rpc;
    let input = rpc.input();
    let mut parameters = Vec::new();
    let mut in_path = Vec::new();
    for segment in &route.template.segments {
        if let Segment::Field(field) = segment {
            in_path.push(field.clone());
            parameters.push(json!({
                "name": field.name(),
                "in": "path",
                "required": true,
                "schema": {"type": "string", "minLength": 1},
                "description": comments(&field.parent_file(), field.path()).unwrap_or_default(),
            }));
        }
    }
    if !route.body {
        for field in input.fields().filter(|field| !in_path.contains(field)) {
            parameters.push(json!({
                "name": field.json_name(),
                "in": "query",
                "required": false,
                "schema": schemas.field(&field),
                "description": comments(&field.parent_file(), field.path()).unwrap_or_default(),
            }));
        }
    }
    let answer = match rpc.is_server_streaming() {
        true => json!({
            "description": format!(
                "Server-Sent Events: each `data:` line is a {} in JSON; a failure ends the \
                 stream with an `error` event whose data is a google.rpc.Status.",
                rpc.output().name()
            ),
            // Before OpenAPI 3.2 (which adds `itemSchema`), a stream's `schema` describes
            // one event, read as its fields.
            "content": {"text/event-stream": {"schema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "event": {
                        "type": "string",
                        "enum": ["message", "error"],
                        "description": "`message` (no `event:` line) for an event, `error` for the status that ends a failed stream.",
                    },
                    "data": {
                        "type": "string",
                        "description": format!(
                            "A {} in JSON, or for `error` a google.rpc.Status in JSON.",
                            rpc.output().name()
                        ),
                    },
                },
            }}},
        }),
        false => json!({
            "description": rpc.output().name(),
            "content": {"application/json": {"schema": schemas.reference(&rpc.output())}},
        }),
    };
    let mut operation = json!({
        "operationId": rpc.name(),
        "summary": rpc.name(),
        "description": comments(&rpc.parent_file(), rpc.path()).unwrap_or_default(),
        "parameters": parameters,
        "responses": {
            "200": answer,
            "default": {
                "description": "An error.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/google.rpc.Status"}}},
            },
        },
    });
    if route.body {
        operation["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": schemas.reference(&input)}},
        });
    }
    operation
}

/// The leading comment of the element at `path` of `file`, trimmed.
fn comments(file: &FileDescriptor, path: &[i32]) -> Option<String> {
    let info = file.file_descriptor_proto().source_code_info.as_ref()?;
    let location = info
        .location
        .iter()
        .find(|location| location.path == path)?;
    let text = location.leading_comments.as_deref()?;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    Some(lines.join(" ").trim().to_owned())
}

/// The message schemas referred to so far.
#[derive(Default)]
struct Schemas {
    defined: BTreeMap<String, Value>,
}

impl Schemas {
    /// A reference to `message`'s schema, defining it (and what it refers to) first.
    fn reference(&mut self, message: &MessageDescriptor) -> Value {
        if let Some(schema) = well_known(message) {
            return schema;
        }
        let name = message.full_name().to_owned();
        if !self.defined.contains_key(&name) {
            // Defined before its fields, so a message that holds itself refers back.
            self.defined.insert(name.clone(), json!({}));
            let mut properties = serde_json::Map::new();
            for field in message.fields() {
                let mut schema = self.field(&field);
                if let Some(text) = comments(&field.parent_file(), field.path())
                    && let Some(object) = schema.as_object_mut()
                    && !object.contains_key("$ref")
                {
                    object.insert("description".into(), Value::String(text));
                }
                properties.insert(field.json_name().to_owned(), schema);
            }
            let description = comments(&message.parent_file(), message.path()).unwrap_or_default();
            self.defined.insert(
                name.clone(),
                json!({"type": "object", "description": description, "properties": properties}),
            );
        }
        json!({"$ref": format!("#/components/schemas/{name}")})
    }

    /// A field's schema in the JSON mapping.
    fn field(&mut self, field: &FieldDescriptor) -> Value {
        if field.is_map()
            && let Kind::Message(entry) = field.kind()
        {
            let value = self.kind(&entry.map_entry_value_field().kind());
            return json!({"type": "object", "additionalProperties": value});
        }
        let one = self.kind(&field.kind());
        match field.is_list() {
            true => json!({"type": "array", "items": one}),
            false => one,
        }
    }

    fn kind(&mut self, kind: &Kind) -> Value {
        match kind {
            Kind::String => json!({"type": "string"}),
            Kind::Bool => json!({"type": "boolean"}),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                json!({"type": "integer", "format": "int32"})
            }
            Kind::Uint32 | Kind::Fixed32 => {
                json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": u32::MAX})
            }
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
                json!({"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"})
            }
            Kind::Uint64 | Kind::Fixed64 => {
                json!({"type": "string", "format": "uint64", "pattern": "^[0-9]+$"})
            }
            Kind::Float => json!({"type": "number", "format": "float"}),
            Kind::Double => json!({"type": "number", "format": "double"}),
            Kind::Bytes => json!({"type": "string", "format": "byte"}),
            Kind::Enum(values) => {
                let names: Vec<String> = values
                    .values()
                    .map(|value| value.name().to_owned())
                    .collect();
                json!({"type": "string", "enum": names})
            }
            Kind::Message(message) => self.reference(message),
        }
    }
}

/// The JSON forms the proto3 mapping gives the well-known types.
fn well_known(message: &MessageDescriptor) -> Option<Value> {
    Some(match message.full_name() {
        "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
        "google.protobuf.Duration" => {
            json!({"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$"})
        }
        "google.protobuf.Struct" => json!({"type": "object"}),
        "google.protobuf.Value" => json!({}),
        "google.protobuf.ListValue" => json!({"type": "array", "items": {}}),
        "google.protobuf.Empty" => json!({"type": "object"}),
        "google.protobuf.FieldMask" => json!({"type": "string"}),
        "google.protobuf.StringValue" => json!({"type": "string"}),
        "google.protobuf.BoolValue" => json!({"type": "boolean"}),
        "google.protobuf.Int32Value" | "google.protobuf.UInt32Value" => {
            json!({"type": "integer"})
        }
        "google.protobuf.Int64Value" | "google.protobuf.UInt64Value" => {
            json!({"type": "string", "pattern": "^-?[0-9]+$"})
        }
        "google.protobuf.FloatValue" | "google.protobuf.DoubleValue" => json!({"type": "number"}),
        "google.protobuf.BytesValue" => json!({"type": "string", "format": "byte"}),
        "google.protobuf.Any" => json!({"type": "object"}),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed document is the one the protos generate. To refresh it, run this
    /// test with `AGENTLOOP_UPDATE_OPENAPI=1`.
    #[test]
    fn the_committed_document_is_current() {
        let document = openapi(
            agentloop_proto::FILE_DESCRIPTOR_SET,
            "agentloop.v1.OrchestratorService",
        )
        .unwrap();
        let text = serde_json::to_string_pretty(&document).unwrap() + "\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        if std::env::var_os("AGENTLOOP_UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == text,
            "docs/openapi.json is not what the protos generate: run \
             AGENTLOOP_UPDATE_OPENAPI=1 cargo test -p agentloop-http the_committed_document"
        );
    }

    #[test]
    fn the_document_describes_every_route_with_schemas_it_defines() {
        let document = openapi(
            agentloop_proto::FILE_DESCRIPTOR_SET,
            "agentloop.v1.OrchestratorService",
        )
        .unwrap();
        let start = &document["paths"]["/v1/invocations"]["post"];
        assert_eq!(start["operationId"], "StartInvocation");
        assert_eq!(
            start["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/agentloop.v1.StartInvocationRequest"
        );
        let watch = &document["paths"]["/v1/invocations/{invocation_id}/events"]["get"];
        assert!(watch["responses"]["200"]["content"]["text/event-stream"].is_object());
        let names: Vec<&str> = watch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["invocation_id", "fromSeq"]);
        // Every reference resolves.
        let text = document.to_string();
        let schemas = document["components"]["schemas"].as_object().unwrap();
        for reference in text.split("\"#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(
                schemas.contains_key(name),
                "{name} is referred to but not defined"
            );
        }
        assert!(
            !schemas["agentloop.v1.StartInvocationRequest"]["description"]
                .as_str()
                .unwrap()
                .is_empty(),
            "the protos' comments describe the schemas"
        );
    }
}
