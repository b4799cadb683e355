//! Between the two forms of a call: JSON, path and query into a request message and onto
//! the gRPC wire; gRPC frames and status back into JSON and an HTTP status.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::StatusCode;
use prost::Message;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage,
    SerializeOptions, Value,
};
use tonic::{Code, Status};

use crate::routes::{Bound, Route};

/// The request message of `route`: the JSON body (when the route takes one), then the
/// query parameters (when it does not), then the fields the path filled. A field given
/// both in the path and in the body must agree.
pub(crate) fn request(
    route: &Route,
    bound: Bound,
    query: Option<&str>,
    body: &[u8],
) -> Result<DynamicMessage, Status> {
    let input = route.rpc.input();
    let mut message = match (route.body, body.iter().all(u8::is_ascii_whitespace)) {
        (true, false) => from_json(input, body)?,
        (true, true) => DynamicMessage::new(input),
        (false, true) => DynamicMessage::new(input),
        (false, false) => {
            return Err(Status::invalid_argument(
                "this route takes no body; its fields are query parameters",
            ));
        }
    };
    if let Some(query) = query.filter(|query| !query.is_empty()) {
        if route.body {
            return Err(Status::invalid_argument(
                "this route takes its fields in the body, not as query parameters",
            ));
        }
        for (name, value) in form_pairs(query)? {
            let field = field_named(&message.descriptor(), &name)
                .filter(|field| !bound.iter().any(|(path, _)| path == field))
                .ok_or_else(|| {
                    Status::invalid_argument(format!("unknown query parameter {name:?}"))
                })?;
            let value = scalar(&field, &value).map_err(|why| {
                Status::invalid_argument(format!("query parameter {name:?}: {why}"))
            })?;
            let slot = message.get_field_mut(&field);
            if let Value::List(list) = slot {
                list.push(value);
            } else {
                *slot = value;
            }
        }
    }
    for (field, value) in bound {
        if let Value::String(given) = message.get_field(&field).as_ref()
            && !given.is_empty()
            && *given != value
        {
            return Err(Status::invalid_argument(format!(
                "{} is {value:?} in the path and {given:?} in the body",
                field.json_name()
            )));
        }
        message.set_field(&field, Value::String(value));
    }
    Ok(message)
}

/// A message from its canonical JSON form; unknown fields are refused.
fn from_json(descriptor: MessageDescriptor, json: &[u8]) -> Result<DynamicMessage, Status> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let message = DynamicMessage::deserialize_with_options(
        descriptor,
        &mut deserializer,
        &DeserializeOptions::new().deny_unknown_fields(true),
    )
    .and_then(|message| deserializer.end().map(|()| message))
    .map_err(|error| Status::invalid_argument(format!("the body is not the request: {error}")))?;
    Ok(message)
}

/// The canonical JSON form of `message`: lowerCamelCase names, 64-bit integers as
/// strings, enums by name, default values left out.
pub(crate) fn to_json(message: &DynamicMessage) -> Result<Vec<u8>, Status> {
    let mut serializer = serde_json::Serializer::new(Vec::new());
    message
        .serialize_with_options(&mut serializer, &SerializeOptions::new())
        .map_err(|error| Status::internal(format!("the answer has no JSON form: {error}")))?;
    Ok(serializer.into_inner())
}

/// A field by its JSON name or its proto name.
fn field_named(descriptor: &MessageDescriptor, name: &str) -> Option<FieldDescriptor> {
    descriptor
        .get_field_by_json_name(name)
        .or_else(|| descriptor.get_field_by_name(name))
}

/// `application/x-www-form-urlencoded` pairs, decoded.
fn form_pairs(query: &str) -> Result<Vec<(String, String)>, Status> {
    let decode = |text: &str| {
        let spaced = text.replace('+', " ");
        percent_encoding::percent_decode_str(&spaced)
            .decode_utf8()
            .map(std::borrow::Cow::into_owned)
            .map_err(|_| Status::invalid_argument("the query is not UTF-8"))
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}

/// Messages whose JSON form is one string.
const STRING_FORMS: [&str; 3] = [
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.FieldMask",
];

/// A scalar field's value from its text in a query.
fn scalar(field: &FieldDescriptor, text: &str) -> Result<Value, String> {
    fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
        text.parse()
            .map_err(|_| format!("{text:?} is not a number of its type"))
    }
    Ok(match field.kind() {
        Kind::String => Value::String(text.to_owned()),
        Kind::Bool => Value::Bool(match text {
            "true" => true,
            "false" => false,
            _ => return Err(format!("{text:?} is not true or false")),
        }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(number(text)?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(number(text)?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(number(text)?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(number(text)?),
        Kind::Float => Value::F32(number(text)?),
        Kind::Double => Value::F64(number(text)?),
        Kind::Enum(values) => match values.get_value_by_name(text) {
            Some(value) => Value::EnumNumber(value.number()),
            None => return Err(format!("{text:?} is not one of {}", values.name())),
        },
        // The well-known types whose JSON form is a string (a timestamp, a duration) are
        // given as that string.
        Kind::Message(message) if STRING_FORMS.contains(&message.full_name()) => {
            DynamicMessage::deserialize(message, serde_json::Value::String(text.to_owned()))
                .map(Value::Message)
                .map_err(|error| error.to_string())?
        }
        Kind::Bytes | Kind::Message(_) => {
            return Err("not a query parameter (send it in a body)".to_owned());
        }
    })
}

/// `message` as one uncompressed gRPC frame.
pub(crate) fn frame(message: &DynamicMessage) -> Bytes {
    let length = message.encoded_len();
    let mut buffer = BytesMut::with_capacity(5 + length);
    buffer.put_u8(0);
    // A request over the gRPC limit is refused by the service, which reads the length.
    buffer.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(&mut buffer);
    buffer.freeze()
}

/// The gRPC messages of a response body as its data arrives, at most `limit` bytes
/// each.
#[derive(Debug)]
pub(crate) struct Frames {
    buffer: BytesMut,
    output: MessageDescriptor,
    limit: usize,
}

impl Frames {
    pub(crate) fn new(output: MessageDescriptor, limit: usize) -> Frames {
        Frames {
            buffer: BytesMut::new(),
            output,
            limit,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// The next whole message, if one has arrived.
    pub(crate) fn next(&mut self) -> Result<Option<DynamicMessage>, Status> {
        let Some(header) = self.buffer.get(..5) else {
            return Ok(None);
        };
        if header[0] != 0 {
            return Err(Status::internal("the service sent a compressed message"));
        }
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if length > self.limit {
            return Err(Status::internal(
                "the service sent a message over the limit",
            ));
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        self.buffer.advance(5);
        let body = self.buffer.split_to(length).freeze();
        DynamicMessage::decode(self.output.clone(), body)
            .map(Some)
            .map_err(|error| Status::internal(format!("the service's answer: {error}")))
    }

    /// Whether part of a message is left over.
    pub(crate) fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// The HTTP status of a gRPC code: the mapping of `google.rpc.Code`.
pub(crate) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `status` as a `google.rpc.Status` JSON object.
pub(crate) fn status_json(status: &Status) -> Vec<u8> {
    let body = serde_json::json!({
        "code": status.code() as i32,
        "message": status.message(),
        "details": [],
    });
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;
    use crate::routes::{Found, Routes};
    use http::Method;
    use prost_reflect::DescriptorPool;

    fn route(method: Method, path: &str) -> (Route, Bound) {
        let pool = DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap();
        let routes = Routes::of(&pool, "agentloop.v1.OrchestratorService").unwrap();
        match routes.find(&method, path) {
            Found::Route(route, bound) => (route.clone(), bound),
            other => panic!("{other:?}"),
        }
    }

    fn json(message: &DynamicMessage) -> serde_json::Value {
        serde_json::from_slice(&to_json(message).unwrap()).unwrap()
    }

    #[test]
    fn a_body_path_and_query_make_one_request() {
        let (start, bound) = route(Method::POST, "/v1/invocations");
        let body = br#"{"goal": "refund", "idempotencyKey": "k-1", "allowed_tools": ["a"]}"#;
        let message = request(&start, bound, None, body).unwrap();
        assert_eq!(
            json(&message),
            serde_json::json!({"goal": "refund", "idempotencyKey": "k-1", "allowedTools": ["a"]})
        );

        let (watch, bound) = route(Method::GET, "/v1/invocations/abc/events");
        let message = request(&watch, bound, Some("fromSeq=7"), b"").unwrap();
        assert_eq!(
            json(&message),
            serde_json::json!({"invocationId": "abc", "fromSeq": "7"})
        );

        let (cancel, bound) = route(Method::POST, "/v1/invocations/abc:cancel");
        let message = request(&cancel, bound, None, br#"{"reason": "a+b c"}"#).unwrap();
        assert_eq!(
            json(&message),
            serde_json::json!({"invocationId": "abc", "reason": "a+b c"})
        );
        let (list, bound) = route(Method::GET, "/v1/invocations");
        let query =
            "terminalReason=TERMINAL_REASON_CANCELLED&createdAfter=2026-12-06T05%3A00%3A00Z";
        let message = request(&list, bound, Some(query), b"").unwrap();
        assert_eq!(
            json(&message),
            serde_json::json!({
                "terminalReason": "TERMINAL_REASON_CANCELLED",
                "createdAfter": "2026-12-06T05:00:00Z"
            })
        );
        let (list, bound) = route(Method::GET, "/v1/invocations");
        let message = request(&list, bound, Some("page_size=5&pageToken=a%2Bb+c"), b"").unwrap();
        assert_eq!(
            json(&message),
            serde_json::json!({"pageSize": 5, "pageToken": "a+b c"})
        );
    }

    #[test]
    fn bad_input_is_invalid_argument_naming_what_is_wrong() {
        // Method, path, query, body, and what the message must name.
        type Case<'a> = (Method, &'a str, Option<&'a str>, &'a [u8], &'a str);
        let cases: [Case<'_>; 8] = [
            (
                Method::POST,
                "/v1/invocations",
                None,
                b"{",
                "not the request",
            ),
            (
                Method::POST,
                "/v1/invocations",
                None,
                br#"{"nope": 1}"#,
                "nope",
            ),
            (
                Method::POST,
                "/v1/invocations",
                None,
                br#"{"goal": 5}"#,
                "not the request",
            ),
            (
                Method::GET,
                "/v1/invocations",
                Some("pageSize=x"),
                b"",
                "pageSize",
            ),
            (Method::GET, "/v1/invocations", Some("nope=1"), b"", "nope"),
            (
                Method::GET,
                "/v1/invocations",
                Some("createdAfter=yesterday"),
                b"",
                "createdAfter",
            ),
            (Method::GET, "/v1/invocations", None, b"{}", "takes no body"),
            (
                Method::POST,
                "/v1/invocations/abc:cancel",
                None,
                br#"{"invocationId": "xyz"}"#,
                "in the path",
            ),
        ];
        for (method, path, query, body, says) in cases {
            let (route, bound) = route(method, path);
            let status = request(&route, bound, query, body).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{path} {query:?}");
            assert!(status.message().contains(says), "{}", status.message());
        }
        // A path field cannot be set again as a query parameter.
        let (watch, bound) = route(Method::GET, "/v1/invocations/abc/events");
        let status = request(&watch, bound, Some("invocationId=xyz"), b"").unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }

    #[test]
    fn frames_are_cut_where_the_wire_cuts_them() {
        let (get, bound) = route(Method::GET, "/v1/invocations/abc");
        let message = request(&get, bound, None, b"").unwrap();
        let one = frame(&message);
        let mut frames = Frames::new(message.descriptor(), 1024);
        // Byte by byte, two messages.
        let both: Vec<u8> = one.iter().chain(one.iter()).copied().collect();
        let mut decoded = Vec::new();
        for byte in both {
            frames.push(&[byte]);
            while let Some(message) = frames.next().unwrap() {
                decoded.push(json(&message));
            }
        }
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[1], serde_json::json!({"invocationId": "abc"}));
        assert!(frames.is_empty());

        let mut small = Frames::new(message.descriptor(), 2);
        small.push(&one);
        assert_eq!(small.next().unwrap_err().code(), Code::Internal);
    }

    #[test]
    fn codes_map_to_the_http_statuses_of_google_rpc_code() {
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status(Code::PermissionDenied), StatusCode::FORBIDDEN);
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(http_status(Code::Cancelled).as_u16(), 499);
        let body: serde_json::Value =
            serde_json::from_slice(&status_json(&Status::not_found("no such invocation"))).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": 5, "message": "no such invocation", "details": []})
        );
    }
}
