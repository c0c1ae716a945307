//! Socket I/O shared by the broker's connections and the client.
//!
//! Frames go out with vectored sends straight from their pieces (a size
//! prefix, a header, the record batches as they sit in the cache or in a
//! produce request): no staging copy, and one system call for a frame of
//! many batches, or for several frames, where a send per piece took tens.
//! The send is tried at once, without waiting (the socket almost always
//! has room); only when it is full does the stream's own write wait.

use std::io::IoSlice;
use std::os::fd::BorrowedFd;

use futures_lite::AsyncWriteExt;

/// Pieces one send hands the kernel at most.
const SEND_PIECES_MAX: usize = 64;

/// Writes `pieces` in order to the stream whose socket is `socket`. Each
/// step hands the kernel as many pieces as one `sendmsg` takes; when the
/// socket is full, the stream's own write waits for room and takes the rest
/// of the current piece.
pub async fn write_vectored<W: futures_lite::AsyncWrite + Unpin, P: AsRef<[u8]>>(
    writer: &mut W,
    socket: BorrowedFd<'_>,
    pieces: &[P],
) -> std::io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < pieces.len() {
        let end = pieces.len().min(index + SEND_PIECES_MAX);
        let slices: Vec<IoSlice<'_>> = std::iter::once(&pieces[index].as_ref()[offset..])
            .chain(pieces[index + 1..end].iter().map(AsRef::as_ref))
            .map(IoSlice::new)
            .collect();
        let mut sent = send_now(socket, &slices);
        if sent == 0 {
            let rest = &pieces[index].as_ref()[offset..];
            writer.write_all(rest).await?;
            sent = rest.len();
        }
        // Step past what went.
        while sent > 0 {
            let left = pieces[index].as_ref().len() - offset;
            if sent < left {
                offset += sent;
                break;
            }
            sent -= left;
            index += 1;
            offset = 0;
        }
        while index < pieces.len() && pieces[index].as_ref().len() == offset {
            index += 1;
            offset = 0;
        }
    }
    Ok(())
}

/// Sends what the socket takes now of `slices`, without waiting; 0 when it
/// takes nothing (or on an error, which the write that follows reports).
fn send_now(socket: BorrowedFd<'_>, slices: &[IoSlice<'_>]) -> usize {
    let socket = socket2::SockRef::from(&socket);
    loop {
        match socket.send_vectored_with_flags(slices, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(sent) => return sent,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 0,
        }
    }
}
