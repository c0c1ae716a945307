//! One client connection: reads size-prefixed frames, runs each request as
//! its own task (so a long-polling Fetch does not stall a Produce behind it),
//! and writes the responses back strictly in request order.
//!
//! Responses leave with vectored sends straight from their chunks (a fetch
//! answer is a list of cached or read batches; see `crate::net`), and the
//! responses already done behind the one being written join its send, so a
//! backlog after a stall drains in a few sends.
//!
//! Requests are started in arrival order and every handler does its state
//! changes (log appends) before its first await, so the effects keep the
//! order of the requests as well.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;

use super::handlers;
use crate::constants::CONNECTION_IN_FLIGHT_MAX;
use crate::protocol::sasl::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use crate::protocol::{self, ApiKey, ErrorCode, ParsedHeader, Reader};
use crate::security::{Authenticator, Step};
use crate::shard::Shard;

/// Responses already done behind the one being written go out with it, in
/// the same send, up to this many bytes.
const GATHER_BYTES_MAX: usize = 1 << 20;
/// Smallest frame that can hold a request header.
const FRAME_BYTES_MIN: usize = 8;
/// A connection to a SASL listener must have logged in this long after it
/// opened, or it is closed.
const SASL_LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// A refused login is answered this much later (Kafka's
/// `connection.failed.authentication.delay.ms`): a password guesser on one
/// connection gets a few tries a second.
const FAILED_LOGIN_DELAY: Duration = Duration::from_millis(100);
/// Largest frame before login (Kafka's `sasl.server.max.receive.size`):
/// an unauthenticated client does not get the broker to hold a large one.
const SASL_FRAME_BYTES_MAX: usize = 512 * 1024;

pub async fn serve(shard: Rc<Shard>, stream: TcpStream, slot: super::limits::ConnectionSlot) {
    let _ = stream.set_nodelay(true);
    let _open = crate::metrics::ConnectionGauge::open();
    let peer: Rc<str> = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default().into();
    // SAFETY: the stream, held by `reader` and `writer`, stays open until
    // this function returns, and `socket` is used only inside it.
    let socket = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let (queue, responses) = local_channel::new_bounded::<InFlight>(CONNECTION_IN_FLIGHT_MAX);
    let writer_task = glommio::spawn_local(async move {
        let mut next = None;
        loop {
            let first = match next.take() {
                Some(in_flight) => in_flight,
                None => match responses.recv().await {
                    Some(in_flight) => in_flight,
                    None => break,
                },
            };
            let (outgoing, close, pending) = gather_ready(first, &responses).await;
            next = pending;
            let result = crate::net::write_vectored(&mut writer, socket, &outgoing.pieces).await;
            drop(outgoing);
            if let Err(e) = result {
                tracing::debug!(error = %e, "closing connection: writing a response failed");
                break;
            }
            if let Some(reason) = close {
                tracing::debug!(%reason, "closing connection after a bad request");
                break;
            }
        }
        // Requests read behind the one that ended the connection go now
        // (their tasks cancelled), not when the reader, waiting for its next
        // frame, drops the channel: until then they counted as in flight.
        drop(next);
        while let Some(Some(_)) = futures_lite::future::poll_once(responses.recv()).await {}
        let _ = writer.close().await;
    });
    // On a SASL listener: the connection's authentication, until it is done.
    let mut sasl = Some(shard.config.sasl_mechanisms()).filter(|m| !m.is_empty()).map(Authenticator::new);
    let login_deadline = std::time::Instant::now() + SASL_LOGIN_TIMEOUT;
    loop {
        if shard.shutting_down.get() {
            break;
        }
        let pending = sasl.as_mut().filter(|a| a.user().is_none());
        let read = if let Some(auth) = &pending {
            // A login that never finishes holds a connection: it gets
            // SASL_LOGIN_TIMEOUT from the connection's start, and its frames
            // are small (a bare token may be 1 byte).
            let frame_min = if auth.expects_bare_token() { 1 } else { FRAME_BYTES_MIN };
            let sizes = frame_min..=SASL_FRAME_BYTES_MAX.min(shard.config.request_bytes_max);
            let left = login_deadline.saturating_duration_since(std::time::Instant::now());
            with_timeout(left, read_frame(&shard, &mut reader, socket, sizes)).await.unwrap_or_else(|| {
                crate::metrics::sasl_refused("timeout");
                Err(format!("no SASL login within {} s", SASL_LOGIN_TIMEOUT.as_secs()))
            })
        } else {
            read_frame(&shard, &mut reader, socket, FRAME_BYTES_MIN..=shard.config.request_bytes_max).await
        };
        let (frame, permit) = match read {
            Ok(Some(read)) => read,
            Ok(None) => break,
            Err(reason) => {
                tracing::debug!(%peer, %reason, "closing connection");
                break;
            }
        };
        let counted = InFlightCount::new(&shard);
        let task_shard = shard.clone();
        let task_peer = peer.clone();
        if let Some(auth) = pending {
            // Before authentication, frames are handled one at a time, here.
            let outcome = authenticate(&shard, auth, frame, &peer, &slot).await;
            let ends = matches!(outcome, handlers::Outcome::Close(_) | handlers::Outcome::RespondAndClose(..));
            let task = glommio::spawn_local(async move { outcome });
            if queue.send((task, (permit, counted))).await.is_err() || ends {
                break;
            }
            continue;
        }
        let task = glommio::spawn_local(async move { handlers::handle(&task_shard, frame, &task_peer).await });
        if queue.send((task, (permit, counted))).await.is_err() {
            break;
        }
    }
    drop(queue);
    writer_task.await;
}

/// A frame on a SASL listener's connection not yet authenticated (see
/// `crate::security`): ApiVersions, SaslHandshake and SaslAuthenticate (or
/// a bare token after a v0 handshake) are answered; anything else closes
/// the connection, as does a refused handshake or token once its answer
/// is sent.
async fn authenticate(
    shard: &Rc<Shard>,
    auth: &mut Authenticator,
    frame: BytesMut,
    peer: &str,
    slot: &super::limits::ConnectionSlot,
) -> handlers::Outcome {
    let image = shard.image();
    if auth.expects_bare_token() {
        return match login(auth, &frame, image.cluster.as_ref(), peer, slot).await {
            Ok(step) => handlers::Outcome::Respond(vec![Bytes::from(step_token(step))]),
            Err(refusal) => handlers::Outcome::Close(refusal.message),
        };
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    if api_key == ApiKey::ApiVersions as i16 {
        return handlers::handle(shard, frame, peer).await;
    }
    let mut reader = Reader::from_frame(frame);
    let request = match protocol::parse_header(&mut reader) {
        Ok(ParsedHeader::Supported(request))
            if matches!(request.api, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) =>
        {
            request
        }
        Ok(ParsedHeader::Supported(request)) => {
            return handlers::Outcome::Close(format!("{:?} before SASL authentication", request.api));
        }
        Ok(ParsedHeader::Unsupported(header)) => {
            return handlers::Outcome::Close(format!(
                "api {} version {} before SASL authentication",
                header.api_key, header.api_version
            ));
        }
        Err(err) => return handlers::Outcome::Close(format!("bad request header: {err}")),
    };
    let version = request.header.api_version;
    let mut w = handlers::response(&request);
    if request.api == ApiKey::SaslHandshake {
        let body = match SaslHandshakeRequest::decode(&mut reader, version) {
            Ok(body) => body,
            Err(err) => return handlers::Outcome::Close(format!("bad SaslHandshake: {err}")),
        };
        let mechanisms = auth.enabled().iter().map(|m| m.name().to_string()).collect();
        return match auth.handshake(&body.mechanism, version) {
            Ok(_) => {
                SaslHandshakeResponse { error: ErrorCode::None, mechanisms }.encode(&mut w, version);
                handlers::respond(w)
            }
            Err(refusal) => {
                crate::metrics::sasl_refused("handshake");
                SaslHandshakeResponse { error: refusal.code, mechanisms }.encode(&mut w, version);
                handlers::Outcome::RespondAndClose(w.into_chunks(), refusal.message)
            }
        };
    }
    let body = match SaslAuthenticateRequest::decode(&mut reader, version) {
        Ok(body) => body,
        Err(err) => return handlers::Outcome::Close(format!("bad SaslAuthenticate: {err}")),
    };
    match login(auth, &body.auth_bytes, image.cluster.as_ref(), peer, slot).await {
        Ok(step) => {
            let auth_bytes = Bytes::from(step_token(step));
            SaslAuthenticateResponse {
                error: ErrorCode::None,
                error_message: None,
                auth_bytes,
                session_lifetime_ms: 0,
            }
            .encode(&mut w, version);
            handlers::respond(w)
        }
        Err(refusal) => {
            SaslAuthenticateResponse {
                error: refusal.code,
                error_message: Some(refusal.message.clone()),
                auth_bytes: Bytes::new(),
                session_lifetime_ms: 0,
            }
            .encode(&mut w, version);
            handlers::Outcome::RespondAndClose(w.into_chunks(), refusal.message)
        }
    }
}

/// One login token through the authenticator, unless the peer's address
/// is throttled; a refusal is counted, logged and answered late
/// (`FAILED_LOGIN_DELAY`).
async fn login(
    auth: &mut Authenticator,
    token: &[u8],
    credentials: &dyn crate::security::Credentials,
    peer: &str,
    slot: &super::limits::ConnectionSlot,
) -> Result<Step, crate::security::Refusal> {
    let allowed = slot.login_allowed();
    let result = if allowed {
        auth.authenticate(token, credentials)
    } else {
        Err(crate::security::Refusal {
            code: ErrorCode::SaslAuthenticationFailed,
            message: "too many failed logins from this address: try again later".into(),
        })
    };
    match result {
        Ok(step) => {
            if let Step::Done { user, .. } = &step {
                crate::metrics::sasl_authenticated();
                tracing::debug!(%peer, %user, "SASL authenticated");
            }
            Ok(step)
        }
        Err(refusal) => {
            slot.login_failed();
            crate::metrics::sasl_refused(if allowed { "failed" } else { "throttled" });
            tracing::info!(%peer, reason = %refusal.message, "SASL authentication failed");
            glommio::timer::sleep(FAILED_LOGIN_DELAY).await;
            Err(refusal)
        }
    }
}

fn step_token(step: Step) -> Vec<u8> {
    match step {
        Step::Continue(token) | Step::Done { token, .. } => token,
    }
}

/// One request counted in the core's `in_flight_requests` (which shutdown
/// waits on) from its read until its response is written or dropped. A
/// connection closed after a bad request used to leave the requests queued
/// behind it counted, and shutdown waited out its 2 s bound.
struct InFlightCount(Rc<Shard>);

impl InFlightCount {
    fn new(shard: &Rc<Shard>) -> Self {
        shard.in_flight_requests.set(shard.in_flight_requests.get() + 1);
        Self(shard.clone())
    }
}

impl Drop for InFlightCount {
    fn drop(&mut self) {
        self.0.in_flight_requests.set(self.0.in_flight_requests.get() - 1);
    }
}

/// Reads one frame; `Ok(None)` on a clean end of stream. Waits up to the
/// idle timeout for a request to begin, takes its size from the core's
/// in-flight budget (waiting while the budget is spent), then allows the
/// request-read timeout for the rest to arrive.
///
/// The part of the frame already in the socket's receive buffer (under
/// load, usually all of it) is received straight into the frame's unused
/// capacity; only the rest is zero-filled and read through `reader`, which
/// waits for it. Zero-filling whole frames first was 13% of the broker's
/// time at max throughput.
async fn read_frame<R: futures_lite::AsyncRead + Unpin>(
    shard: &Rc<Shard>,
    reader: &mut R,
    socket: BorrowedFd<'_>,
    sizes: std::ops::RangeInclusive<usize>,
) -> Result<Option<(BytesMut, glommio::sync::StaticPermit)>, String> {
    let config = &shard.config;
    let mut size = [0u8; 4];
    let idle = Duration::from_millis(config.idle_timeout_ms);
    match with_timeout(idle, reader.read_exact(&mut size)).await {
        Some(Ok(())) => {}
        Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Some(Err(e)) => return Err(e.to_string()),
        None => return Err("idle timeout".into()),
    }
    let size = i32::from_be_bytes(size);
    if !usize::try_from(size).is_ok_and(|size| sizes.contains(&size)) {
        return Err(format!("frame size {size} outside {}..={}", sizes.start(), sizes.end()));
    }
    let permit = shard.in_flight_budget.acquire_static_permit(size as u64).await.map_err(|e| e.to_string())?;
    let size = size as usize;
    let mut frame = BytesMut::with_capacity(size);
    let arrived = receive_arrived(socket, &mut frame.spare_capacity_mut()[..size]);
    // SAFETY: recv wrote (initialised) the first `arrived` bytes.
    unsafe { frame.set_len(arrived) };
    frame.resize(size, 0);
    let read_timeout = Duration::from_millis(config.request_read_timeout_ms);
    match with_timeout(read_timeout, reader.read_exact(&mut frame[arrived..])).await {
        Some(Ok(())) => Ok(Some((frame, permit))),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("request read timeout".into()),
    }
}

/// Receives what the socket holds now, up to `buffer`'s length, without
/// waiting; 0 when nothing is there (or on an error or end of stream, which
/// the read that follows reports).
fn receive_arrived(socket: BorrowedFd<'_>, buffer: &mut [MaybeUninit<u8>]) -> usize {
    let socket = socket2::SockRef::from(&socket);
    loop {
        match socket.recv_with_flags(buffer, libc::MSG_DONTWAIT) {
            Ok(received) => return received,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 0,
        }
    }
}

async fn with_timeout<T>(limit: Duration, work: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

/// A request read and running: its handler's task, its share of the core's
/// in-flight budget and its place in the in-flight count, both released
/// once its response is written.
type InFlight = (glommio::Task<handlers::Outcome>, (glommio::sync::StaticPermit, InFlightCount));

/// Responses gathered for one send: each a 4-byte size prefix and its
/// chunks, in request order, and what they hold of the core's budgets.
#[derive(Default)]
struct Outgoing {
    pieces: Vec<Bytes>,
    bytes: usize,
    _held: Vec<(glommio::sync::StaticPermit, InFlightCount)>,
}

impl Outgoing {
    fn push(&mut self, chunks: Vec<Bytes>) {
        let len: usize = chunks.iter().map(Bytes::len).sum();
        self.pieces.push(Bytes::copy_from_slice(&(len as i32).to_be_bytes()));
        self.pieces.extend(chunks);
        self.bytes += len + 4;
    }
}

/// Waits for `first`'s response, then takes the responses queued behind it
/// that are already done (without waiting for any), up to
/// `GATHER_BYTES_MAX`: after a stall the backlog's responses leave in a few
/// sends instead of one each. Returns them, the reason to close the
/// connection if a request asked for that (the responses before it still
/// go), and the first request not yet done, which is the next to wait for.
async fn gather_ready(
    first: InFlight,
    responses: &local_channel::LocalReceiver<InFlight>,
) -> (Outgoing, Option<String>, Option<InFlight>) {
    let mut outgoing = Outgoing::default();
    let (task, mut held) = first;
    let mut outcome = task.await;
    loop {
        outgoing._held.push(held);
        match outcome {
            handlers::Outcome::Respond(chunks) => outgoing.push(chunks),
            handlers::Outcome::NoResponse => {}
            handlers::Outcome::Close(reason) => return (outgoing, Some(reason), None),
            handlers::Outcome::RespondAndClose(chunks, reason) => {
                outgoing.push(chunks);
                return (outgoing, Some(reason), None);
            }
        }
        if outgoing.bytes >= GATHER_BYTES_MAX {
            return (outgoing, None, None);
        }
        let Some(Some((mut task, next_held))) = futures_lite::future::poll_once(responses.recv()).await else {
            return (outgoing, None, None);
        };
        match futures_lite::future::poll_once(&mut task).await {
            Some(done) => {
                outcome = done;
                held = next_held;
            }
            None => return (outgoing, None, Some((task, next_held))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response larger than the socket takes at once, in thousands of
    /// chunks, arrives whole and in order.
    #[test]
    fn a_large_response_in_many_chunks_arrives_whole() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(1 << 20)
            .spawn(|| async {
                let listener = glommio::net::TcpListener::bind("127.0.0.1:0").expect("binds");
                let address = listener.local_addr().expect("has an address");
                // 3,000 chunks of 1-4 KiB: ~7.5 MB, more than the socket buffer takes at once.
                let chunks: Vec<Bytes> = (0..3000u32)
                    .map(|i| {
                        Bytes::from(
                            (0..1024 + (i % 3072)).map(|j| (i as usize * 31 + j as usize) as u8).collect::<Vec<u8>>(),
                        )
                    })
                    .collect();
                let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
                let reading = glommio::spawn_local(async move {
                    let mut client = TcpStream::connect(address).await.expect("connects");
                    let mut size = [0u8; 4];
                    client.read_exact(&mut size).await.expect("reads the prefix");
                    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
                    client.read_exact(&mut body).await.expect("reads the body");
                    body
                });
                let stream = listener.accept().await.expect("accepts");
                // SAFETY: `stream`, held by the split halves, outlives `socket`.
                let socket = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
                let (_reader, mut writer) = futures_lite::io::split(stream);
                let mut outgoing = Outgoing::default();
                outgoing.push(chunks);
                crate::net::write_vectored(&mut writer, socket, &outgoing.pieces).await.expect("writes");
                let body = reading.await;
                assert_eq!(body.len(), expected.len());
                assert!(body == expected, "the body differs from the chunks sent");
            })
            .expect("executor starts")
            .join()
            .expect("test passes");
    }
}
