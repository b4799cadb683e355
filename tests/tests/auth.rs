//! Identity and tenancy end to end, over both wirings: every public RPC with every kind
//! of credential (real tokens from generated keys), the public port serving the
//! orchestrator alone, internal services refusing callers without their service token,
//! and the per-tenant bound holding under concurrent starts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_auth::testing::{Alg, TokenIssuer, now_s};
use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use serde_json::json;
use tonic::Code;

both_wirings!(
    every_rpc_answers_every_credential_as_documented,
    the_public_port_serves_the_orchestrator_alone,
    a_tenant_gets_exactly_its_bound_under_concurrent_starts,
    a_tenant_starts_at_its_rate_and_others_are_not_held_back,
);

const TENANT: &str = "acme";
const DONE: &str = r#"{"turns": [{"final": "done"}]}"#;

/// An orchestrator with `[auth] mode = "jwt"` over keys of `issuer`, and the directory
/// that holds them.
async fn authenticated(
    wiring: Wiring,
    issuer: &TokenIssuer,
    configure: impl FnOnce(&mut OrchestratorConfig),
) -> (System, tempfile::TempDir) {
    let keys = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.server.auth = issuer.write_key_source(keys.path());
    configure(&mut config);
    (System::start(wiring, config).await, keys)
}

async fn client_with(system: &System, token: Option<&str>) -> OrchestratorServiceClient<Transport> {
    let transport = agentloop_stack::channel_as(&system.stack().endpoint(), token)
        .await
        .unwrap();
    agentloop_proto::client::orchestrator(transport)
}

/// The credentials of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    None,
    BadSignature,
    Expired,
    WrongAudience,
    OtherTenant,
    SameTenant,
    Approver,
    Operator,
}

const CREDENTIALS: [Credential; 8] = [
    Credential::None,
    Credential::BadSignature,
    Credential::Expired,
    Credential::WrongAudience,
    Credential::OtherTenant,
    Credential::SameTenant,
    Credential::Approver,
    Credential::Operator,
];

fn token(issuer: &TokenIssuer, stranger: &TokenIssuer, credential: Credential) -> Option<String> {
    let claims = |tenant: &str, aud: &str, exp: u64, roles: &[&str]| {
        json!({
            "iss": agentloop_auth::testing::ISSUER,
            "aud": aud,
            "sub": "alice",
            "tenant": tenant,
            "roles": roles,
            "exp": exp,
        })
    };
    let later = now_s() + 600;
    match credential {
        Credential::None => None,
        Credential::BadSignature => Some(stranger.token("alice", TENANT, &[])),
        Credential::Expired => {
            Some(issuer.token_with(claims(TENANT, "agentloop", now_s() - 3_600, &[])))
        }
        Credential::WrongAudience => {
            Some(issuer.token_with(claims(TENANT, "someone-else", later, &[])))
        }
        Credential::OtherTenant => Some(issuer.token("mallory", "other", &["approver"])),
        Credential::SameTenant => Some(issuer.token("alice", TENANT, &[])),
        Credential::Approver => Some(issuer.token("bob", TENANT, &["approver"])),
        Credential::Operator => Some(issuer.token("olga", TENANT, &["operator"])),
    }
}

/// The code each RPC answers with a credential, on an existing invocation of `acme`.
fn expected(rpc: &str, credential: Credential) -> Code {
    match credential {
        Credential::None
        | Credential::BadSignature
        | Credential::Expired
        | Credential::WrongAudience => Code::Unauthenticated,
        // Another tenant's invocation does not exist for it; its own start and listing work.
        Credential::OtherTenant => match rpc {
            "start" | "list" => Code::Ok,
            _ => Code::NotFound,
        },
        Credential::SameTenant | Credential::Approver | Credential::Operator => match rpc {
            // Only approvers reach the resolution, which finds nothing waiting: the
            // invocation completed.
            "resolve" if credential != Credential::Approver => Code::PermissionDenied,
            "resolve" | "answer" => Code::FailedPrecondition,
            // Only operators reach the ledger, which has no such effect.
            "settle" if credential != Credential::Operator => Code::PermissionDenied,
            "settle" => Code::NotFound,
            _ => Code::Ok,
        },
    }
}

async fn code_of<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

async fn every_rpc_answers_every_credential_as_documented(wiring: Wiring) {
    let issuer = TokenIssuer::new(Alg::Es256);
    let stranger = TokenIssuer::new(Alg::Es256);
    let (system, _keys) = authenticated(wiring, &issuer, |_| {}).await;
    let alice = issuer.token("alice", TENANT, &[]);
    let mut owner = client_with(&system, Some(&alice)).await;
    // The token's identity is the invocation's; the body may repeat it, not change it.
    let invocation = run_to_end(
        &mut owner,
        pb::StartInvocationRequest {
            tenant: TENANT.into(),
            ..start_request(DONE)
        },
    )
    .await
    .0;
    assert_eq!(
        (invocation.actor.as_str(), invocation.tenant.as_str()),
        ("alice", TENANT)
    );
    let id = invocation.invocation_id.clone();

    for credential in CREDENTIALS {
        let token = token(&issuer, &stranger, credential);
        let mut client = client_with(&system, token.as_deref()).await;
        let before = get(&mut owner, &id).await;
        let start = client.start_invocation(start_request(DONE)).await;
        let codes = [
            ("start", code_of(start).await),
            (
                "get",
                code_of(
                    client
                        .get_invocation(pb::GetInvocationRequest {
                            invocation_id: id.clone(),
                        })
                        .await,
                )
                .await,
            ),
            (
                "list",
                code_of(
                    client
                        .list_invocations(pb::ListInvocationsRequest::default())
                        .await,
                )
                .await,
            ),
            (
                "watch",
                code_of(
                    client
                        .watch_invocation(pb::WatchInvocationRequest {
                            invocation_id: id.clone(),
                            from_seq: 1,
                        })
                        .await,
                )
                .await,
            ),
            (
                "cancel",
                code_of(
                    client
                        .cancel_invocation(pb::CancelInvocationRequest {
                            invocation_id: id.clone(),
                            reason: "matrix".into(),
                        })
                        .await,
                )
                .await,
            ),
            (
                "resolve",
                code_of(
                    client
                        .resolve_approval(pb::ResolveApprovalRequest {
                            invocation_id: id.clone(),
                            proposal_digest: "0".repeat(64),
                            verdict: pb::ApprovalVerdict::Approve as i32,
                            actor: String::new(),
                            comment: String::new(),
                        })
                        .await,
                )
                .await,
            ),
            (
                "answer",
                code_of(
                    client
                        .answer_clarification(pb::AnswerClarificationRequest {
                            invocation_id: id.clone(),
                            answer: "yes".into(),
                            actor: String::new(),
                            action: 0,
                        })
                        .await,
                )
                .await,
            ),
            (
                "effects",
                code_of(
                    client
                        .list_unresolved_effects(pb::ListUnresolvedEffectsRequest {
                            invocation_id: id.clone(),
                            ..Default::default()
                        })
                        .await,
                )
                .await,
            ),
            (
                "settle",
                code_of(
                    client
                        .settle_effect(pb::SettleEffectRequest {
                            invocation_id: id.clone(),
                            effect_key: "0".repeat(64),
                            state: pb::EffectState::Rejected as i32,
                            receipt: String::new(),
                            detail: "matrix".into(),
                            actor: String::new(),
                        })
                        .await,
                )
                .await,
            ),
        ];
        for (rpc, code) in codes {
            assert_eq!(code, expected(rpc, credential), "{rpc} with {credential:?}");
        }
        // Refused calls changed nothing of acme's invocation.
        let after = get(&mut owner, &id).await;
        assert_eq!(before.last_seq, after.last_seq, "{credential:?}");
    }

    // A listing holds the caller's tenant alone: acme's starts (alice's first one and the
    // same-tenant, approver and operator rounds), never "other"'s.
    let listed = owner
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert!(listed.iter().all(|i| i.tenant == TENANT));
    let mut other = client_with(&system, Some(&issuer.token("mallory", "other", &[]))).await;
    let theirs = other
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(theirs.len(), 1);
    assert_eq!(
        (theirs[0].tenant.as_str(), theirs[0].actor.as_str()),
        ("other", "mallory")
    );

    // A body naming another tenant or actor is refused, and stores nothing.
    for request in [
        pb::StartInvocationRequest {
            tenant: "other".into(),
            ..start_request(DONE)
        },
        pb::StartInvocationRequest {
            actor: "mallory".into(),
            ..start_request(DONE)
        },
    ] {
        let refused = owner.start_invocation(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    // Idempotency keys are the tenant's: one key in two tenants is two invocations.
    let keyed = |key: &str| pb::StartInvocationRequest {
        idempotency_key: key.into(),
        ..start_request(DONE)
    };
    let ours = owner
        .start_invocation(keyed("k-1"))
        .await
        .unwrap()
        .into_inner();
    let theirs = other
        .start_invocation(keyed("k-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(ours.created && theirs.created);
    // Naming one's own tenant and actor is the same request as leaving them out.
    let again = owner
        .start_invocation(pb::StartInvocationRequest {
            tenant: TENANT.into(),
            actor: "alice".into(),
            ..keyed("k-1")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(
        again.invocation.map(|i| i.invocation_id),
        ours.invocation.as_ref().map(|i| i.invocation_id.clone())
    );
    let (ours, theirs) = (ours.invocation.unwrap(), theirs.invocation.unwrap());
    assert_ne!(ours.invocation_id, theirs.invocation_id);
    // A different request under another tenant's key conflicts with the caller's own only.
    let conflict = other
        .start_invocation(pb::StartInvocationRequest {
            goal: "another goal".into(),
            ..keyed("k-1")
        })
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    assert!(
        !conflict.message().contains(&ours.invocation_id),
        "{conflict:?}"
    );
    assert!(
        conflict.message().contains(&theirs.invocation_id),
        "{conflict:?}"
    );
    let listed = owner
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(listed.len(), 5, "the refused starts stored nothing");
    system.stop().await;
}

/// Calls each internal service's first RPC over `transport`; the codes, by service.
async fn internal_codes(transport: Transport) -> Vec<(&'static str, Code)> {
    use agentloop_proto::client as c;
    vec![
        (
            "executor",
            code_of(
                c::tool_executor(transport.clone())
                    .describe(pb::DescribeRequest::default())
                    .await,
            )
            .await,
        ),
        (
            "ledger",
            code_of(
                c::effect_ledger(transport.clone())
                    .list_unresolved(pb::ListUnresolvedRequest::default())
                    .await,
            )
            .await,
        ),
        (
            "gateway",
            code_of(
                c::tool_gateway(transport.clone())
                    .list_tools(pb::ListToolsRequest::default())
                    .await,
            )
            .await,
        ),
        (
            "policy",
            code_of(
                c::policy(transport.clone())
                    .evaluate(pb::EvaluateRequest::default())
                    .await,
            )
            .await,
        ),
        (
            "decision",
            code_of(
                c::decision(transport)
                    .decide(pb::DecideRequest::default())
                    .await,
            )
            .await,
        ),
    ]
}

async fn the_public_port_serves_the_orchestrator_alone(wiring: Wiring) {
    let issuer = TokenIssuer::new(Alg::EdDsa);
    let (system, _keys) = authenticated(wiring, &issuer, |_| {}).await;
    let token = issuer.token("alice", TENANT, &["approver"]);
    // Even with a valid token the public port has no internal service to offer.
    let public = agentloop_stack::channel_as(&system.stack().endpoint(), Some(&token))
        .await
        .unwrap();
    for (service, code) in internal_codes(public).await {
        assert_eq!(code, Code::Unimplemented, "{service} on the public port");
    }
    let Some(endpoints) = system.stack().endpoints() else {
        // Embedded: the internal services have no port at all.
        system.stop().await;
        return;
    };
    let tokens = endpoints.tokens.clone();
    let at = |service: &str| match service {
        "executor" => endpoints.demo_executor.clone(),
        "ledger" => endpoints.ledger.clone(),
        "gateway" => endpoints.tools.clone(),
        "policy" => endpoints.policy.clone(),
        "decision" => endpoints.decision.clone(),
        other => panic!("{other}"),
    };
    // Each internal service refuses a caller without a token, with a stranger's token, or
    // with the token of a service that is not its caller; its own caller gets through
    // (the answer is then the service's own, never UNAUTHENTICATED).
    for service in ["executor", "ledger", "gateway", "policy", "decision"] {
        let own = if service == "executor" {
            &tokens.tools
        } else {
            &tokens.orchestrator
        };
        let wrong = if service == "executor" {
            &tokens.orchestrator
        } else {
            &tokens.tools
        };
        for (presented, refused) in [
            (None, true),
            (Some("a-stranger-token-that-is-long-enough-to-be-one"), true),
            (Some(token.as_str()), true),
            (Some(wrong.as_str()), true),
            (Some(own.as_str()), false),
        ] {
            let transport = agentloop_stack::channel_as(&at(service), presented)
                .await
                .unwrap();
            let code = internal_codes(transport)
                .await
                .into_iter()
                .find(|(name, _)| *name == service)
                .unwrap()
                .1;
            if refused {
                assert_eq!(code, Code::Unauthenticated, "{service} with {presented:?}");
            } else {
                assert_ne!(
                    code,
                    Code::Unauthenticated,
                    "{service} with its caller's token"
                );
            }
        }
    }
    system.stop().await;
}

async fn a_tenant_gets_exactly_its_bound_under_concurrent_starts(wiring: Wiring) {
    const BOUND: usize = 3;
    // Parks every invocation on its first turn (a long sleep), so they keep running.
    const PARK: &str = r#"{"turns": [{"tool_calls": [{"id": "s", "name": "sleep", "arguments": {"ms": 60000}}]}]}"#;
    let issuer = TokenIssuer::new(Alg::Hs256);
    let (system, _keys) = authenticated(wiring, &issuer, |config| {
        config.tenants.max_running = BOUND;
        // The parked sleeps are cancelled at once when the test stops the system.
        config.limits.drain_timeout_ms = 50;
    })
    .await;
    let acme = issuer.token("alice", TENANT, &[]);
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..4 * BOUND {
        let mut client = client_with(&system, Some(&acme)).await;
        starts.spawn(async move { client.start_invocation(start_request(PARK)).await });
    }
    let mut accepted = 0;
    while let Some(joined) = starts.join_next().await {
        match joined.unwrap() {
            Ok(_) => accepted += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("tenants.max_running"),
                    "{status:?}"
                );
            }
        }
    }
    assert_eq!(accepted, BOUND, "exactly the tenant's bound is running");
    // Another tenant is not held back by acme's bound.
    let mut other = client_with(&system, Some(&issuer.token("bob", "other", &[]))).await;
    other.start_invocation(start_request(PARK)).await.unwrap();
    // One of acme's ends: its place comes back.
    let mut client = client_with(&system, Some(&acme)).await;
    let running = client
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(running.len(), BOUND);
    let first = running[0].invocation_id.clone();
    client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: first.clone(),
            reason: "make room".into(),
        })
        .await
        .unwrap();
    let ended = events_until_end(&mut client, &first, 1).await;
    assert!(!ended.is_empty());
    // The runner gives its place back as it stops, just after the end is committed:
    // retry on RESOURCE_EXHAUSTED, a bounded number of round trips.
    let mut admitted = false;
    for _ in 0..2_000 {
        match client.start_invocation(start_request(PARK)).await {
            Ok(_) => {
                admitted = true;
                break;
            }
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::task::yield_now().await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    assert!(
        admitted,
        "an ended invocation gives its tenant's place back"
    );
    system.stop().await;
}

async fn a_tenant_starts_at_its_rate_and_others_are_not_held_back(wiring: Wiring) {
    let issuer = TokenIssuer::new(Alg::Hs256);
    // A burst of two, then one a second: the four starts take a few milliseconds.
    let (system, _keys) = authenticated(wiring, &issuer, |config| {
        config.tenants.starts_per_s = 1;
        config.tenants.start_burst = 2;
    })
    .await;
    for tenant in [TENANT, "other"] {
        let mut client = client_with(&system, Some(&issuer.token("alice", tenant, &[]))).await;
        let mut codes = Vec::new();
        for _ in 0..4 {
            match client.start_invocation(start_request(DONE)).await {
                Ok(_) => codes.push(Code::Ok),
                Err(status) => {
                    assert!(
                        status.message().contains("tenants.starts_per_s"),
                        "{status:?}"
                    );
                    assert!(status.message().contains("retry in"), "{status:?}");
                    codes.push(status.code());
                }
            }
        }
        assert_eq!(
            codes,
            [
                Code::Ok,
                Code::Ok,
                Code::ResourceExhausted,
                Code::ResourceExhausted
            ],
            "{tenant}"
        );
    }
    // Refused starts stored nothing.
    let mut client = client_with(&system, Some(&issuer.token("alice", TENANT, &[]))).await;
    let listed = client
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(listed.len(), 2);
    system.stop().await;
}
