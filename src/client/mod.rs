//! Kafka clients over the broker's own codecs (`protocol`). This file: a
//! small blocking client, one request at a time per connection, for the
//! `shardlog topic` commands and the tests. `pipelined`: the asynchronous,
//! pipelined client on glommio that the load generator (`bench`) drives.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;

use crate::protocol::{self, ApiKey, DecodeError, Reader, Writer};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("response does not decode: {0}")]
    Decode(#[from] DecodeError),
    #[error("response correlation id {got} does not match request {expected}")]
    Correlation { expected: i32, got: i32 },
    #[error("response of {0} bytes is too large")]
    TooLarge(i32),
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("{0}")]
    Unsupported(String),
}

/// A request on the wire, waiting for `Connection::read_response`.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    correlation_id: i32,
    flexible_header: bool,
}

/// The SASL login every `Connection` of this process makes first (the
/// client commands' `--sasl-*` settings); none: no SASL.
static LOGIN: std::sync::OnceLock<crate::security::SaslLogin> = std::sync::OnceLock::new();

/// Makes every `Connection` opened from now on log in as `login` (and
/// the pipelined connections made with default options).
pub fn use_login(login: crate::security::SaslLogin) {
    let _ = LOGIN.set(login);
}

/// The login `use_login` set.
pub fn login() -> Option<crate::security::SaslLogin> {
    LOGIN.get().cloned()
}

/// A refused SASL handshake or login, as an error naming the broker.
pub fn sasl_refused(address: &str, error: &crate::protocol::ErrorCode, detail: &str) -> ClientError {
    ClientError::Closed(format!("{address}: SASL login refused: {error:?} {detail}"))
}

/// One connection to one broker node.
pub struct Connection {
    stream: TcpStream,
    correlation_id: i32,
    client_id: String,
}

/// Responses larger than this are refused (a broken or hostile peer).
const RESPONSE_BYTES_MAX: i32 = 256 * 1024 * 1024;

impl Connection {
    pub fn connect(address: impl ToSocketAddrs, timeout: Duration) -> Result<Self, ClientError> {
        let address = address
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))?;
        let stream = TcpStream::connect_timeout(&address, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout.max(Duration::from_secs(30))))?;
        let mut connection = Self { stream, correlation_id: 0, client_id: "shardlog-cli".into() };
        if let Some(login) = LOGIN.get() {
            connection.log_in(login, &address.to_string())?;
        }
        Ok(connection)
    }

    /// SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate v1.
    fn log_in(&mut self, login: &crate::security::SaslLogin, address: &str) -> Result<(), ClientError> {
        use crate::protocol::sasl::*;
        let name = login.mechanism.name().to_string();
        let mut reader =
            self.request(ApiKey::SaslHandshake, 1, |w| SaslHandshakeRequest { mechanism: name }.encode(w, 1))?;
        let handshake = SaslHandshakeResponse::decode(&mut reader, 1)?;
        if !handshake.error.is_ok() {
            return Err(sasl_refused(address, &handshake.error, &handshake.mechanisms.join(", ")));
        }
        let mut exchange = login.exchange();
        let mut token = exchange.first();
        loop {
            let encode = |w: &mut Writer| SaslAuthenticateRequest { auth_bytes: token.into() }.encode(w, 1);
            let mut reader = self.request(ApiKey::SaslAuthenticate, 1, encode)?;
            let answer = SaslAuthenticateResponse::decode(&mut reader, 1)?;
            if !answer.error.is_ok() {
                return Err(sasl_refused(address, &answer.error, &answer.error_message.unwrap_or_default()));
            }
            match exchange.next(&answer.auth_bytes).map_err(|e| ClientError::Closed(e.to_string()))? {
                Some(next) => token = next,
                None => return Ok(()),
            }
        }
    }

    /// The client id sent with each request.
    pub fn set_client_id(&mut self, client_id: &str) {
        self.client_id = client_id.into();
    }

    /// Sends a request whose body `encode` writes, and returns a reader over
    /// the response body (header consumed).
    pub fn request(
        &mut self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
    ) -> Result<Reader, ClientError> {
        let sent = self.send_request(api, version, encode)?;
        self.read_response(sent)
    }

    /// Sends a request without waiting for its response (pipelining: read
    /// the responses in the order the requests went, with `read_response`).
    pub fn send_request(
        &mut self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
    ) -> Result<Sent, ClientError> {
        self.correlation_id += 1;
        let correlation_id = self.correlation_id;
        let flexible = api.range().is_some_and(|r| version >= r.flexible_from);
        let mut w = Writer::new();
        w.i16(api as i16);
        w.i16(version);
        w.i32(correlation_id);
        w.nullable_string(Some(&self.client_id));
        w.tagged_fields_v(flexible);
        encode(&mut w);
        self.send_frame(w.into_bytes())?;
        Ok(Sent { correlation_id, flexible_header: flexible && api != ApiKey::ApiVersions })
    }

    /// The response to a request `send_request` sent (header consumed).
    pub fn read_response(&mut self, sent: Sent) -> Result<Reader, ClientError> {
        let mut reader = Reader::new(self.read_frame()?);
        let got = reader.i32()?;
        if got != sent.correlation_id {
            return Err(ClientError::Correlation { expected: sent.correlation_id, got });
        }
        if sent.flexible_header {
            reader.tagged_fields()?;
        }
        Ok(reader)
    }

    /// Sends a request that gets no response (acks=0 produce).
    pub fn send_only(
        &mut self,
        api: ApiKey,
        version: i16,
        encode: impl FnOnce(&mut Writer),
    ) -> Result<(), ClientError> {
        self.correlation_id += 1;
        let mut w = Writer::new();
        w.i16(api as i16);
        w.i16(version);
        w.i32(self.correlation_id);
        w.nullable_string(Some(&self.client_id));
        encode(&mut w);
        self.send_frame(w.into_bytes())
    }

    /// Writes raw bytes (tests of malformed frames).
    pub fn send_raw(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(data)?;
        Ok(())
    }

    pub fn send_frame(&mut self, body: Bytes) -> Result<(), ClientError> {
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&(body.len() as i32).to_be_bytes());
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame)?;
        Ok(())
    }

    pub fn read_frame(&mut self) -> Result<Bytes, ClientError> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size)?;
        let size = i32::from_be_bytes(size);
        if !(0..=RESPONSE_BYTES_MAX).contains(&size) {
            return Err(ClientError::TooLarge(size));
        }
        let mut body = vec![0u8; size as usize];
        self.stream.read_exact(&mut body)?;
        Ok(Bytes::from(body))
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.stream.set_read_timeout(timeout)?;
        Ok(())
    }
}

pub mod admin;
pub mod groups;
pub mod pipelined;
pub mod reassign;
pub mod status;

/// Decodes a response with a codec (`T::decode`).
pub fn decode<T>(
    mut reader: Reader,
    version: i16,
    decode: impl FnOnce(&mut Reader, i16) -> Result<T, DecodeError>,
) -> Result<T, ClientError> {
    Ok(decode(&mut reader, version)?)
}

pub use protocol::ErrorCode;
