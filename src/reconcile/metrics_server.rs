//! Serves `src/metrics.rs` at `http://ADDR/metrics` when the configuration names a loopback
//! address (`metricsAddress`; off by default): scrapes come from a collector on the node.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;

type Body = http_body_util::Full<hyper::body::Bytes>;

fn answer(req: &Request<Incoming>) -> Response<Body> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            crate::metrics::render(),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "flexnode serves /metrics only\n".to_string(),
        ),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

/// Binds `addr` and serves until the task is dropped. A failure to bind is returned (the
/// daemon logs it and runs on without metrics); a failed connection only ends itself.
pub async fn serve(addr: SocketAddr) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving metrics at /metrics");
    Ok(tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(answer(&req))
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "metrics: connection ended");
                }
            });
        }
    }))
}

/// Serves at `addr` if set; a failure to bind is logged and the daemon runs on without.
pub async fn start(addr: Option<SocketAddr>) -> Option<tokio::task::AbortHandle> {
    let addr = addr?;
    match serve(addr).await {
        Ok(task) => Some(task.abort_handle()),
        Err(e) => {
            tracing::warn!(%addr, error = %e, "metrics are not served: the address cannot be bound");
            None
        }
    }
}
