//! The routes of a service, read from the `google.api.http` option of each of its
//! methods: the HTTP method, the path template, and what the body fills.

use http::Method;
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MethodDescriptor, Value};

use crate::RouteError;

/// The option's full name.
const HTTP_OPTION: &str = "google.api.http";

/// One RPC reached over HTTP.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) method: Method,
    pub(crate) template: Template,
    /// The body fills the whole request (`body: "*"`); otherwise the fields not in the
    /// path are query parameters.
    pub(crate) body: bool,
    pub(crate) rpc: MethodDescriptor,
    /// `/package.Service/Method`.
    pub(crate) grpc_path: String,
}

/// A path template: literal segments and `{field}` segments, and an optional `:verb`
/// after the last one.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    /// As written in the option.
    pub(crate) text: String,
    pub(crate) segments: Vec<Segment>,
    pub(crate) verb: Option<String>,
}

/// One segment of a template.
#[derive(Debug, Clone)]
pub(crate) enum Segment {
    Literal(String),
    /// A string field of the request, filled from the segment.
    Field(FieldDescriptor),
}

/// What a request path filled: each field with its decoded segment.
pub(crate) type Bound = Vec<(FieldDescriptor, String)>;

/// The routes of one service.
#[derive(Debug, Clone)]
pub(crate) struct Routes {
    pub(crate) routes: Vec<Route>,
}

/// What a method and path found.
#[derive(Debug)]
pub(crate) enum Found<'a> {
    Route(&'a Route, Bound),
    /// The path names a route, but not with this method: the methods it has.
    OtherMethods(Vec<Method>),
    Nothing,
}

impl Routes {
    /// The routes of `service` (its full name) in `pool`: one per method that has the
    /// option; a method without it is not reachable over HTTP.
    pub(crate) fn of(pool: &DescriptorPool, service: &str) -> Result<Routes, RouteError> {
        let service = pool
            .get_service_by_name(service)
            .ok_or_else(|| RouteError::NoService(service.to_owned()))?;
        let option = pool
            .get_extension_by_name(HTTP_OPTION)
            .ok_or(RouteError::NoHttpOption)?;
        let mut routes = Vec::new();
        for rpc in service.methods() {
            let options = rpc.options();
            if !options.has_extension(&option) {
                continue;
            }
            let rule = options.get_extension(&option);
            let Value::Message(rule) = rule.as_ref() else {
                continue;
            };
            let invalid = |why: String| RouteError::Invalid {
                rpc: rpc.full_name().to_owned(),
                why,
            };
            let mut found = None;
            for (name, method) in [
                ("get", Method::GET),
                ("put", Method::PUT),
                ("post", Method::POST),
                ("delete", Method::DELETE),
                ("patch", Method::PATCH),
            ] {
                if let Some(Value::String(path)) = rule.get_field_by_name(name).as_deref()
                    && !path.is_empty()
                {
                    found = Some((method, path.clone()));
                }
            }
            let (method, path) =
                found.ok_or_else(|| invalid("no get, put, post, delete or patch".into()))?;
            let body = match rule.get_field_by_name("body").as_deref() {
                Some(Value::String(body)) if body == "*" => true,
                Some(Value::String(body)) if body.is_empty() => false,
                Some(_) | None => {
                    return Err(invalid("only body \"*\" or none is supported".into()));
                }
            };
            if rpc.is_client_streaming() {
                return Err(invalid("a client stream has no HTTP form".into()));
            }
            let template = Template::parse(&path, &rpc).map_err(invalid)?;
            routes.push(Route {
                method,
                template,
                body,
                grpc_path: format!("/{}/{}", service.full_name(), rpc.name()),
                rpc,
            });
        }
        Ok(Routes { routes })
    }

    /// The route `method` and `path` reach, with the fields the path fills.
    pub(crate) fn find(&self, method: &Method, path: &str) -> Found<'_> {
        let mut others = Vec::new();
        for route in &self.routes {
            if let Some(bound) = route.template.matches(path) {
                if route.method == *method {
                    return Found::Route(route, bound);
                }
                others.push(route.method.clone());
            }
        }
        match others.is_empty() {
            true => Found::Nothing,
            false => Found::OtherMethods(others),
        }
    }
}

impl Template {
    /// Parses `text` for `rpc`: every `{field}` must be a string field of its request.
    fn parse(text: &str, rpc: &MethodDescriptor) -> Result<Template, String> {
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| format!("{text:?} does not start with /"))?;
        // The verb follows the last segment, after a colon outside braces.
        let last = rest.rfind('/').map_or(0, |slash| slash + 1);
        let (rest, verb) = match rest[last..].rfind(':') {
            Some(colon) if !rest[last + colon..].contains('}') => {
                let at = last + colon;
                (&rest[..at], Some(rest[at + 1..].to_owned()))
            }
            Some(_) | None => (rest, None),
        };
        let input = rpc.input();
        let mut segments = Vec::new();
        for part in rest.split('/') {
            if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let field = input
                    .get_field_by_name(name)
                    .ok_or_else(|| format!("{text:?}: {name} is not a field of the request"))?;
                if field.kind() != Kind::String || field.is_list() {
                    return Err(format!("{text:?}: {name} is not a string field"));
                }
                segments.push(Segment::Field(field));
            } else if part.is_empty() || part.contains(['{', '}', '*']) {
                return Err(format!("{text:?}: only literal and {{field}} segments"));
            } else {
                segments.push(Segment::Literal(part.to_owned()));
            }
        }
        Ok(Template {
            text: text.to_owned(),
            segments,
            verb,
        })
    }

    /// The fields `path` fills, if it matches; a field's segment is percent-decoded and
    /// never empty.
    fn matches(&self, path: &str) -> Option<Bound> {
        let path = match &self.verb {
            Some(verb) => path.strip_suffix(verb.as_str())?.strip_suffix(':')?,
            None => path,
        };
        let mut parts = path.strip_prefix('/')?.split('/');
        let mut bound = Vec::new();
        for segment in &self.segments {
            let part = parts.next()?;
            match segment {
                Segment::Literal(literal) => {
                    if part != literal {
                        return None;
                    }
                }
                Segment::Field(field) => {
                    let value = percent_encoding::percent_decode_str(part)
                        .decode_utf8()
                        .ok()?;
                    if value.is_empty() {
                        return None;
                    }
                    bound.push((field.clone(), value.into_owned()));
                }
            }
        }
        match parts.next() {
            Some(_) => None,
            None => Some(bound),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;

    fn routes() -> Routes {
        let pool = DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap();
        Routes::of(&pool, "agentloop.v1.OrchestratorService").unwrap()
    }

    fn find(routes: &Routes, method: Method, path: &str) -> Option<(String, Vec<String>)> {
        match routes.find(&method, path) {
            Found::Route(route, bound) => Some((
                route.rpc.name().to_owned(),
                bound.into_iter().map(|(_, value)| value).collect(),
            )),
            Found::OtherMethods(_) | Found::Nothing => None,
        }
    }

    #[test]
    fn every_rpc_of_the_orchestrator_has_a_route() {
        let routes = routes();
        let pool = DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap();
        let service = pool
            .get_service_by_name("agentloop.v1.OrchestratorService")
            .unwrap();
        assert_eq!(routes.routes.len(), service.methods().len());
    }

    #[test]
    fn paths_reach_their_rpc_with_the_fields_they_fill() {
        let routes = routes();
        let id = "0190a8f2-0000-7000-8000-000000000001";
        assert_eq!(
            find(&routes, Method::POST, "/v1/invocations"),
            Some(("StartInvocation".into(), vec![]))
        );
        assert_eq!(
            find(&routes, Method::GET, "/v1/invocations"),
            Some(("ListInvocations".into(), vec![]))
        );
        assert_eq!(
            find(&routes, Method::GET, &format!("/v1/invocations/{id}")),
            Some(("GetInvocation".into(), vec![id.into()]))
        );
        assert_eq!(
            find(
                &routes,
                Method::GET,
                &format!("/v1/invocations/{id}/events")
            ),
            Some(("WatchInvocation".into(), vec![id.into()]))
        );
        assert_eq!(
            find(
                &routes,
                Method::POST,
                &format!("/v1/invocations/{id}:cancel")
            ),
            Some(("CancelInvocation".into(), vec![id.into()]))
        );
        assert_eq!(
            find(&routes, Method::GET, "/v1/effects:unresolved"),
            Some(("ListUnresolvedEffects".into(), vec![]))
        );
        // Percent-encoded segments are decoded.
        assert_eq!(
            find(&routes, Method::GET, "/v1/invocations/a%20b"),
            Some(("GetInvocation".into(), vec!["a b".into()]))
        );
    }

    #[test]
    fn near_misses_find_nothing_or_the_methods_the_path_has() {
        let routes = routes();
        for path in [
            "/v1/invocations/",
            "/v1/invocations//events",
            "/v1/invocations/x/events/more",
            "/v1/effects",
            "v1/invocations",
            "/v2/invocations",
        ] {
            assert!(
                matches!(routes.find(&Method::POST, path), Found::Nothing),
                "{path}"
            );
        }
        // An ID may hold a colon: the path is GetInvocation's, which is not POST.
        assert!(matches!(
            routes.find(&Method::POST, "/v1/invocations/x:uncancel"),
            Found::OtherMethods(methods) if methods == [Method::GET]
        ));
        match routes.find(&Method::DELETE, "/v1/invocations") {
            Found::OtherMethods(mut methods) => {
                methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                assert_eq!(methods, vec![Method::GET, Method::POST]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_template_must_name_string_fields_of_the_request() {
        let pool = DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap();
        let rpc = pool
            .get_service_by_name("agentloop.v1.OrchestratorService")
            .unwrap()
            .methods()
            .find(|m| m.name() == "WatchInvocation")
            .unwrap();
        assert!(Template::parse("/v1/{nope}", &rpc).is_err());
        assert!(Template::parse("/v1/{from_seq}", &rpc).is_err());
        assert!(Template::parse("v1/x", &rpc).is_err());
        assert!(Template::parse("/v1/*", &rpc).is_err());
        let template = Template::parse("/v1/{invocation_id}:watch", &rpc).unwrap();
        assert_eq!(template.verb.as_deref(), Some("watch"));
        assert_eq!(template.segments.len(), 2);
    }
}
