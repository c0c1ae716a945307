//! The controller port's frames and connection threads (issue 29), shared
//! by the quorum's voters (`service`) and the machines that only follow the
//! metadata log (`observer`).
//!
//! Every frame, both ways:
//!
//! ```text
//! 0   4  length n of what follows (u32 LE), 9 ..= FRAME_BYTES_MAX
//! 4   8  sender's machine id (u64 LE, not 0)
//! 12  1  kind
//! 13  -  body, by kind:
//!        0 RAFT       a prost raft Message (voter to voter)
//!        1 REQUEST    request id u64, the request's bytes (to a voter)
//!        2 ANSWER     request id u64, status u8 (0 answered, 1 not the
//!                     controller: the leader's machine id u64 follows, 0
//!                     when unknown; 2 failed: the reason follows), the
//!                     answer's bytes
//!        3 FETCH      committed offset the asker holds u64, its
//!                     incarnation u64 (0: not registered yet)
//!        4 FETCHED    see `Fetched`
//!        5 HEARTBEAT  the sender's incarnation u64 (to the leader)
//! ```
//!
//! An answer or a FETCHED goes back on the connection its request came in
//! on, so a machine that is not a voter needs no port of its own. Lengths
//! are checked before anything is allocated.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use super::ids::MachineId;
use super::image::Provenance;

pub const FRAME_RAFT: u8 = 0;
pub const FRAME_REQUEST: u8 = 1;
pub const FRAME_ANSWER: u8 = 2;
pub const FRAME_FETCH: u8 = 3;
pub const FRAME_FETCHED: u8 = 4;
pub const FRAME_HEARTBEAT: u8 = 5;
pub const ANSWER_OK: u8 = 0;
pub const ANSWER_NOT_CONTROLLER: u8 = 1;
pub const ANSWER_FAILED: u8 = 2;
/// A frame larger than this closes the connection.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Frames queued on one connection; more are dropped (Raft resends, a
/// fetch or a request is retried).
pub const OUTBOX_DEPTH: usize = 1024;
/// A write that makes no progress for this long closes the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Data unacknowledged this long closes a connection (TCP_USER_TIMEOUT). A
/// cut link otherwise holds a connection open while the kernel's
/// retransmissions back off to tens of seconds, and what was queued on it
/// (a forwarded request, Raft's catch-up) waits that long after the link
/// heals. Closed, the writer connects again as soon as the peer answers.
const UNACKNOWLEDGED_MAX: Duration = Duration::from_secs(2);

/// Every controller-port connection: no Nagle delay, and a connection whose
/// peer stopped acknowledging is closed (`UNACKNOWLEDGED_MAX`).
pub fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let _ = socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_MAX));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(1))
        .with_interval(Duration::from_secs(1))
        .with_retries(2);
    let _ = socket.set_tcp_keepalive(&keepalive);
}

/// Frames to send on one connection.
pub type Outbox = flume::Sender<Vec<u8>>;

/// One frame as read.
#[derive(Debug)]
pub struct Frame {
    pub from: MachineId,
    pub kind: u8,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of an impossible length {0}")]
    Length(usize),
    #[error("a frame from machine 0")]
    NoSender,
    #[error("a frame body that does not decode: {0}")]
    Body(&'static str),
}

/// A whole frame: header and `body`.
pub fn frame(from: MachineId, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(13 + body.len());
    frame.extend_from_slice(&((9 + body.len()) as u32).to_le_bytes());
    frame.extend_from_slice(&from.get().to_le_bytes());
    frame.push(kind);
    frame.extend_from_slice(body);
    frame
}

/// Reads one frame; the length is checked before the body is allocated.
pub fn read_frame(stream: &mut impl Read) -> Result<Frame, FrameError> {
    let mut header = [0u8; 13];
    stream.read_exact(&mut header)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    if !(9..=FRAME_BYTES_MAX).contains(&len) {
        return Err(FrameError::Length(len));
    }
    let from = MachineId::new(u64::from_le_bytes(header[4..12].try_into().expect("8 bytes")));
    let mut body = vec![0u8; len - 9];
    stream.read_exact(&mut body)?;
    Ok(Frame { from: from.ok_or(FrameError::NoSender)?, kind: header[12], body })
}

/// Starts a thread that writes the returned outbox's frames to `stream`
/// until every sender is gone or a write fails; then it closes the stream
/// (which ends its reader too).
pub fn spawn_writer(stream: TcpStream, name: &str) -> Outbox {
    let (tx, rx) = flume::bounded::<Vec<u8>>(OUTBOX_DEPTH);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut stream = stream;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while let Ok(frame) = rx.recv() {
                if stream.write_all(&frame).is_err() {
                    break;
                }
            }
            let _ = stream.shutdown(Shutdown::Both);
        })
        .expect("spawn a controller connection writer");
    tx
}

/// A cursor over a body that fails instead of panicking at its end.
pub struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        let (head, rest) = self.0.split_at_checked(8).ok_or(FrameError::Body("short u64"))?;
        self.0 = rest;
        Ok(u64::from_le_bytes(head.try_into().expect("8 bytes")))
    }

    pub fn u32(&mut self) -> Result<u32, FrameError> {
        let (head, rest) = self.0.split_at_checked(4).ok_or(FrameError::Body("short u32"))?;
        self.0 = rest;
        Ok(u32::from_le_bytes(head.try_into().expect("4 bytes")))
    }

    pub fn u8(&mut self) -> Result<u8, FrameError> {
        let (head, rest) = self.0.split_first().ok_or(FrameError::Body("short u8"))?;
        self.0 = rest;
        Ok(*head)
    }

    /// `len` bytes, checked against what is left before copying.
    pub fn bytes(&mut self, len: usize) -> Result<&'a [u8], FrameError> {
        let (head, rest) = self.0.split_at_checked(len).ok_or(FrameError::Body("short bytes"))?;
        self.0 = rest;
        Ok(head)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// A voter's answer to a FETCH: the committed metadata after the asker's
/// offset, as a snapshot when the entries it needs were compacted away.
///
/// ```text
/// leader u64 (0 unknown) | commit offset u64 | has snapshot u8
/// [snapshot: offset u64 | epoch u64 | len u32 | bytes]
/// count u32 | count × (offset u64 | epoch u64 | len u32 | record batch)
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    pub leader: Option<MachineId>,
    pub commit: u64,
    pub snapshot: Option<(Provenance, Vec<u8>)>,
    pub entries: Vec<(Provenance, Vec<u8>)>,
}

impl Fetched {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.leader.map_or(0, MachineId::get).to_le_bytes());
        out.extend_from_slice(&self.commit.to_le_bytes());
        let put = |out: &mut Vec<u8>, at: &Provenance, bytes: &[u8]| {
            out.extend_from_slice(&at.offset.to_le_bytes());
            out.extend_from_slice(&at.epoch.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        };
        match &self.snapshot {
            Some((at, bytes)) => {
                out.push(1);
                put(&mut out, at, bytes);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (at, bytes) in &self.entries {
            put(&mut out, at, bytes);
        }
        out
    }

    pub fn decode(body: &[u8]) -> Result<Self, FrameError> {
        let mut cursor = Cursor(body);
        let leader = MachineId::new(cursor.u64()?);
        let commit = cursor.u64()?;
        let take = |cursor: &mut Cursor| -> Result<(Provenance, Vec<u8>), FrameError> {
            let at = Provenance { offset: cursor.u64()?, epoch: cursor.u64()? };
            let len = cursor.u32()? as usize;
            Ok((at, cursor.bytes(len)?.to_vec()))
        };
        let snapshot = match cursor.u8()? {
            0 => None,
            1 => Some(take(&mut cursor)?),
            _ => return Err(FrameError::Body("snapshot flag")),
        };
        let count = cursor.u32()? as usize;
        // Each entry takes at least 20 bytes: a count beyond that is a lie.
        if count > cursor.0.len() / 20 {
            return Err(FrameError::Body("entry count"));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(take(&mut cursor)?);
        }
        if !cursor.0.is_empty() {
            return Err(FrameError::Body("trailing bytes"));
        }
        Ok(Self { leader, commit, snapshot, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetched_answer_round_trips_and_a_truncated_or_lying_one_is_refused() {
        let fetched = Fetched {
            leader: MachineId::new(3),
            commit: 42,
            snapshot: Some((Provenance { offset: 40, epoch: 2 }, vec![1, 2, 3])),
            entries: vec![
                (Provenance { offset: 41, epoch: 2 }, vec![9]),
                (Provenance { offset: 42, epoch: 3 }, vec![]),
            ],
        };
        let bytes = fetched.encode();
        assert_eq!(Fetched::decode(&bytes).unwrap(), fetched);
        for cut in 0..bytes.len() {
            assert!(Fetched::decode(&bytes[..cut]).is_err(), "a body cut at {cut} must not decode");
        }
        let mut lying = Fetched::default().encode();
        let at = lying.len() - 4;
        lying[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Fetched::decode(&lying), Err(FrameError::Body("entry count"))));
    }

    #[test]
    fn a_frame_of_an_impossible_length_is_refused_before_its_body_is_read() {
        let mut bytes = frame(MachineId::new(1).unwrap(), FRAME_HEARTBEAT, &7u64.to_le_bytes());
        assert_eq!(read_frame(&mut bytes.as_slice()).unwrap().body, 7u64.to_le_bytes());
        bytes[..4].copy_from_slice(&(FRAME_BYTES_MAX as u32 + 1).to_le_bytes());
        assert!(matches!(read_frame(&mut bytes.as_slice()), Err(FrameError::Length(_))));
        bytes[..4].copy_from_slice(&8u32.to_le_bytes());
        assert!(matches!(read_frame(&mut bytes.as_slice()), Err(FrameError::Length(8))));
        let zero = frame(MachineId::new(1).unwrap(), FRAME_HEARTBEAT, &[]);
        let mut zero = zero;
        zero[4..12].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(read_frame(&mut zero.as_slice()), Err(FrameError::NoSender)));
    }
}
