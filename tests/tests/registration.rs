//! An executor that registers itself with a running deployment: written with
//! `agentloop-executor`, it calls `RegisterExecutor` on the distributed stack's gateway
//! (as the registrar, the one caller admitted to that method), and the policy service
//! and the orchestrator follow the gateway's registry without a restart: an invocation
//! started after the registration calls the new tool, its turn records the tool's
//! contract version, and once the executor is gone the call answers UNAVAILABLE at
//! once.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::time::Duration;

use agentloop_e2e::*;
use agentloop_executor::{CallError, Context, Executor, SideEffect, Tool};
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use agentloop_stack::Wiring;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tonic::Code;

/// Arguments of `greet`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GreetArgs {
    /// Who to greet.
    name: String,
}

#[derive(Serialize)]
struct Greeting {
    greeting: String,
}

struct Greet;

impl Tool for Greet {
    const NAME: &'static str = "greet";
    const DESCRIPTION: &'static str = "Greets someone by name. Read-only.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    const TIMEOUT: Duration = Duration::from_secs(5);
    type Args = GreetArgs;
    type Output = Greeting;

    async fn call(&self, args: GreetArgs, _ctx: &Context) -> Result<Greeting, CallError> {
        Ok(Greeting {
            greeting: format!("Hello, {}!", args.name),
        })
    }
}

const GREET: &str = r#"{"turns": [
  {"tool_calls": [{"id": "hi", "name": "greet", "arguments": {"name": "Ada"}}]},
  {"final": "Greeted Ada.", "evidence": ["hi"]}
]}"#;

fn greet_request() -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        allowed_tools: vec!["greet".into()],
        ..start_request(GREET)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_executor_is_followed_by_policy_and_the_orchestrator() {
    let mut config = OrchestratorConfig::default();
    config.limits.tools_refresh_ms = 50;
    let system = System::start_with(Wiring::Distributed, config, |services| {
        services.policy.tools_refresh_ms = 50;
        services.gateway.health_check_ms = 50;
    })
    .await;
    let mut client = system.client().await;
    // The orchestrator lists the gateway's tools at its first start: greet is not there.
    let refused = client.start_invocation(greet_request()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let executor = Executor::builder().tool(Greet).build().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(agentloop_executor::serve(
        listener,
        executor,
        agentloop_server::Access::default(),
        async {
            let _ = stopped.await;
        },
    ));

    let endpoints = system.stack().endpoints().unwrap();
    let gateway_as = |token: &str| {
        let (tools, token) = (endpoints.tools.clone(), token.to_owned());
        async move {
            agentloop_proto::client::tool_gateway(
                agentloop_stack::channel_as(&tools, Some(&token))
                    .await
                    .unwrap(),
            )
        }
    };
    let mut registrar = gateway_as(&endpoints.tokens.registrar).await;
    let mut orchestrator = gateway_as(&endpoints.tokens.orchestrator).await;
    // Each caller may call only its own methods.
    let not_a_registrar = orchestrator
        .register_executor(pb::RegisterExecutorRequest {
            endpoint: endpoint.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(not_a_registrar.code(), Code::PermissionDenied);
    let not_a_caller = registrar
        .list_tools(pb::ListToolsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(not_a_caller.code(), Code::PermissionDenied);

    let registered = registrar
        .register_executor(pb::RegisterExecutorRequest {
            endpoint: endpoint.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(registered.tools.len(), 1);
    let digest = registered.tools[0].digest.clone();

    // Followed without a restart: starts are refused until the orchestrator lists greet,
    // and its call is judged by policy (which refuses unknown tools) and runs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let id = loop {
        match client.start_invocation(greet_request()).await {
            Ok(started) => break started.into_inner().invocation.unwrap().invocation_id,
            Err(status) if status.code() == Code::InvalidArgument => {
                assert!(tokio::time::Instant::now() < deadline, "{status:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    let events = events_until_end(&mut client, &id, 1).await;
    assert_eq!(
        reason(&get(&mut client, &id).await),
        pb::TerminalReason::Completed,
        "{events:?}"
    );
    let first = turns(&events)[0];
    match &first.results[0].outcome {
        Some(pb::tool_result::Outcome::Output(output)) => {
            assert!(output.output_json.contains("Hello, Ada!"), "{output:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(first.tool_digests.get("greet"), Some(&digest));

    // The executor goes away: the next call to greet answers UNAVAILABLE at once.
    stop.send(()).unwrap();
    served.await.unwrap().unwrap();
    let (_, events) = run_to_end(&mut client, greet_request()).await;
    match &turns(&events)[0].results[0].outcome {
        Some(pb::tool_result::Outcome::Error(error)) => {
            assert_eq!(
                error.error_type,
                pb::ErrorType::Unavailable as i32,
                "{error:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let listed = orchestrator
        .list_tools(pb::ListToolsRequest {
            names: vec!["greet".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.tools[0].unavailable);
    system.stop().await;
}
