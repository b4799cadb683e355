//! [`Guarded`]: a service that only its callers reach, by their client certificates or
//! their service tokens.
//!
//! A tower wrapper rather than a tonic interceptor: an intercepted service answers with
//! another body type than the one [`ServiceSet`](crate::ServiceSet) routes, and the
//! wrapper keeps the service's name, so health and reflection still report it.

use std::convert::Infallible;
use std::task::{Context, Poll};

use agentloop_auth::{Caller, Callers};
use tonic::body::Body;
use tonic::codegen::Service as TowerService;
use tonic::codegen::http::{Request, Response};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// `S`, refusing every call without the service token of one of `callers`
/// (UNAUTHENTICATED, before `S` sees it); a call that passes carries its caller's name
/// in its extensions ([`Caller`]).
#[derive(Debug, Clone)]
pub(crate) struct Guarded<S> {
    service: S,
    callers: Callers,
}

impl<S> Guarded<S> {
    pub(crate) fn new(service: S, callers: Callers) -> Guarded<S> {
        Guarded { service, callers }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

type GuardedFuture<F> =
    futures::future::Either<F, std::future::Ready<Result<Response<Body>, Infallible>>>;

impl<S> TowerService<Request<Body>> for Guarded<S>
where
    S: TowerService<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = GuardedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        // A client certificate the handshake verified names its caller; otherwise the
        // service token does.
        let by_certificate = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .and_then(|chain| {
                let leaf = chain.first()?;
                self.callers.authenticate_certificate(leaf)
            });
        let verdict = match by_certificate {
            Some(name) => Ok(name),
            None => {
                // The headers move into the metadata view and back: nothing is copied.
                let metadata = MetadataMap::from_headers(std::mem::take(request.headers_mut()));
                let verdict = self.callers.authenticate(&metadata);
                *request.headers_mut() = metadata.into_headers();
                verdict
            }
        };
        match verdict {
            Ok(name) => {
                request.extensions_mut().insert(Caller(name));
                futures::future::Either::Left(self.service.call(request))
            }
            Err(error) => {
                let status = tonic::Status::from(error);
                futures::future::Either::Right(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
