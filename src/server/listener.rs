//! Each core's listener. Per-core mode binds `port + core` without
//! SO_REUSEPORT (so a second broker on the same port fails loudly); shared
//! mode binds every core to one port with SO_REUSEPORT and lets the kernel
//! spread connections.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;

use glommio::net::TcpListener;

use crate::config::ListenerMode;
use crate::shard::Shard;

pub fn bind(address: SocketAddr, mode: ListenerMode) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if mode == ListenerMode::Shared {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    // SAFETY: the descriptor comes from a socket we own and hand over whole.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Accepts connections until shutdown, serving each on this core.
pub async fn run(shard: Rc<Shard>, listener: TcpListener, limits: std::sync::Arc<super::limits::ConnectionLimits>) {
    loop {
        let shutdown = shard.shutdown_event.listen();
        if shard.shutting_down.get() {
            break;
        }
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shutdown.await;
            None
        })
        .await;
        match accepted {
            Some(Ok(stream)) => {
                let ip = match stream.peer_addr() {
                    Ok(address) => address.ip(),
                    Err(_) => continue,
                };
                match limits.admit(ip) {
                    Ok(slot) => {
                        glommio::spawn_local(super::connection::serve(shard.clone(), stream, slot)).detach();
                    }
                    Err(reason) => {
                        tracing::warn!(%ip, reason, "connection refused");
                        crate::metrics::record_connection_refused(reason);
                        let _ = stream.shutdown(std::net::Shutdown::Both).await;
                    }
                }
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            }
            None => break,
        }
    }
}
