//! Listening: the accept loop with its connection cap and header timeout, and
//! graceful shutdown (Ctrl-C / SIGTERM, a grace period, a second Ctrl-C).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::{router, AppState};

/// How long running requests get to finish after Ctrl-C / SIGTERM before the
/// server exits anyway (a second Ctrl-C exits at once).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves until Ctrl-C / SIGTERM.
pub async fn serve(state: Arc<AppState>) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", state.config.host, state.config.port)
        .parse()
        .or_else(|_| {
            std::net::ToSocketAddrs::to_socket_addrs(&(
                state.config.host.as_str(),
                state.config.port,
            ))
            .map_err(anyhow::Error::from)
            .and_then(|mut a| a.next().ok_or_else(|| anyhow::anyhow!("no address")))
        })?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        "serving {} on http://{} ({} tool calls)",
        state.config.model_name,
        listener.local_addr()?,
        format!("{:?}", state.tool_format)
    );
    eprintln!(
        "tempo9: serving {} on http://{}",
        state.config.model_name,
        listener.local_addr()?
    );
    serve_on(listener, state, shutdown_signal()).await;
    Ok(())
}

/// Serves connections from `listener` until `shutdown` completes, then lets
/// open connections finish their requests for up to [`SHUTDOWN_GRACE`] (a
/// second Ctrl-C ends the wait).
///
/// Unlike `axum::serve`: each connection must send its request head within
/// `--header-timeout` (which also closes keep-alive connections idle that
/// long), and at most `--max-connections` are open at once (further clients
/// wait in the listen backlog), so silent clients can neither pile up nor
/// hold a shutdown forever.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = router(state.clone());
    let conns = Arc::new(Semaphore::new(state.config.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(state.config.header_timeout)
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = conns.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait, don't spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!("shutting down: waiting for open requests");
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!("requests still open after {} s; exiting", SHUTDOWN_GRACE.as_secs());
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!("tempo9: second interrupt; exiting now");
            std::process::exit(130);
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
