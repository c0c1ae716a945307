//! SaslHandshake (key 17) v0–1 and SaslAuthenticate (key 36) v0–1, both
//! directions, non-flexible (SaslAuthenticate v2 is the flexible form).
//! After a v0 handshake the tokens travel bare (size-prefixed, no Kafka
//! header), which `server::connection` handles; v1 carries them in
//! SaslAuthenticate. See `crate::security`.
//!
//! ```text
//! SaslHandshake     request   mechanism string
//!                   response  error_code i16, mechanisms [string]
//! SaslAuthenticate  request   auth_bytes bytes
//!                   response  error_code i16, error_message nullable string,
//!                             auth_bytes bytes, session_lifetime_ms i64 (v1+)
//! ```

use bytes::Bytes;

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const HANDSHAKE_VERSION_MAX: i16 = 1;
pub const AUTHENTICATE_VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslHandshakeRequest {
    pub mechanism: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslHandshakeResponse {
    pub error: ErrorCode,
    /// The mechanisms this listener enables.
    pub mechanisms: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslAuthenticateRequest {
    pub auth_bytes: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslAuthenticateResponse {
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub auth_bytes: Bytes,
    /// 0: the session does not expire (KIP-368).
    pub session_lifetime_ms: i64,
}

impl SaslHandshakeRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::SaslHandshake, HANDSHAKE_VERSION_MAX, version)?;
        Ok(Self { mechanism: r.string()? })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::SaslHandshake, HANDSHAKE_VERSION_MAX, version).is_ok());
        w.string(&self.mechanism);
    }
}

impl SaslHandshakeResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::SaslHandshake, HANDSHAKE_VERSION_MAX, version).is_ok());
        w.i16(self.error.code());
        w.array_len_v(self.mechanisms.len(), false);
        for mechanism in &self.mechanisms {
            w.string(mechanism);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::SaslHandshake, HANDSHAKE_VERSION_MAX, version)?;
        let error = error::from_code(r.i16()?);
        let count = r.array_len(2)?;
        let mechanisms = (0..count).map(|_| r.string()).collect::<DecodeResult<_>>()?;
        Ok(Self { error, mechanisms })
    }
}

impl SaslAuthenticateRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::SaslAuthenticate, AUTHENTICATE_VERSION_MAX, version)?;
        Ok(Self { auth_bytes: r.bytes()? })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::SaslAuthenticate, AUTHENTICATE_VERSION_MAX, version).is_ok());
        w.bytes_v(&self.auth_bytes, false);
    }
}

impl SaslAuthenticateResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::SaslAuthenticate, AUTHENTICATE_VERSION_MAX, version).is_ok());
        w.i16(self.error.code());
        w.nullable_string(self.error_message.as_deref());
        w.bytes_v(&self.auth_bytes, false);
        if version >= 1 {
            w.i64(self.session_lifetime_ms);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::SaslAuthenticate, AUTHENTICATE_VERSION_MAX, version)?;
        let error = error::from_code(r.i16()?);
        let error_message = r.nullable_string()?;
        let auth_bytes = r.bytes()?;
        let session_lifetime_ms = if version >= 1 { r.i64()? } else { 0 };
        Ok(Self { error, error_message, auth_bytes, session_lifetime_ms })
    }
}

fn check(api: ApiKey, max: i16, version: i16) -> DecodeResult<()> {
    if (0..=max).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: api as i16, version })
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::messages::{
        sasl_authenticate_request as kp_auth_req, sasl_authenticate_response as kp_auth_resp,
        sasl_handshake_request as kp_hs_req, sasl_handshake_response as kp_hs_resp,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    fn ours<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    fn theirs<T: Encodable>(message: &T, version: i16) -> Bytes {
        let mut out = BytesMut::new();
        message.encode(&mut out, version).expect("kafka-protocol encodes");
        out.freeze()
    }

    #[test]
    fn sasl_handshake_matches_kafka_protocol_encoding_both_ways() {
        for version in 0..=HANDSHAKE_VERSION_MAX {
            let request = SaslHandshakeRequest { mechanism: "SCRAM-SHA-512".into() };
            let bytes = ours(|w| request.encode(w, version));
            let kafka =
                kp_hs_req::SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("SCRAM-SHA-512"));
            assert_eq!(bytes, theirs(&kafka, version));
            assert_eq!(SaslHandshakeRequest::decode(&mut Reader::new(bytes), version).unwrap(), request);
            let response = SaslHandshakeResponse {
                error: ErrorCode::UnsupportedSaslMechanism,
                mechanisms: vec!["PLAIN".into(), "SCRAM-SHA-256".into()],
            };
            let bytes = ours(|w| response.encode(w, version));
            let kafka = kp_hs_resp::SaslHandshakeResponse::default()
                .with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
                .with_mechanisms(vec![StrBytes::from_static_str("PLAIN"), StrBytes::from_static_str("SCRAM-SHA-256")]);
            assert_eq!(bytes, theirs(&kafka, version));
            assert_eq!(SaslHandshakeResponse::decode(&mut Reader::new(bytes), version).unwrap(), response);
        }
    }

    #[test]
    fn sasl_authenticate_matches_kafka_protocol_encoding_both_ways() {
        for version in 0..=AUTHENTICATE_VERSION_MAX {
            let request = SaslAuthenticateRequest { auth_bytes: Bytes::from_static(b"n,,n=alice,r=abc") };
            let bytes = ours(|w| request.encode(w, version));
            let kafka = kp_auth_req::SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from_static(b"n,,n=alice,r=abc"));
            assert_eq!(bytes, theirs(&kafka, version));
            assert_eq!(SaslAuthenticateRequest::decode(&mut Reader::new(bytes), version).unwrap(), request);
            let response = SaslAuthenticateResponse {
                error: ErrorCode::SaslAuthenticationFailed,
                error_message: Some("no".into()),
                auth_bytes: Bytes::from_static(b"v=abc"),
                session_lifetime_ms: if version >= 1 { 60_000 } else { 0 },
            };
            let bytes = ours(|w| response.encode(w, version));
            let kafka = kp_auth_resp::SaslAuthenticateResponse::default()
                .with_error_code(ErrorCode::SaslAuthenticationFailed.code())
                .with_error_message(Some(StrBytes::from_static_str("no")))
                .with_auth_bytes(Bytes::from_static(b"v=abc"))
                .with_session_lifetime_ms(response.session_lifetime_ms);
            assert_eq!(bytes, theirs(&kafka, version));
            assert_eq!(SaslAuthenticateResponse::decode(&mut Reader::new(bytes), version).unwrap(), response);
        }
    }

    #[test]
    fn truncated_sasl_requests_are_decode_errors() {
        let handshake = ours(|w| SaslHandshakeRequest { mechanism: "PLAIN".into() }.encode(w, 1));
        for cut in 0..handshake.len() {
            assert!(SaslHandshakeRequest::decode(&mut Reader::new(handshake.slice(..cut)), 1).is_err());
        }
        let token = ours(|w| SaslAuthenticateRequest { auth_bytes: Bytes::from_static(b"\0a\0b") }.encode(w, 1));
        for cut in 0..token.len() {
            assert!(SaslAuthenticateRequest::decode(&mut Reader::new(token.slice(..cut)), 1).is_err());
        }
    }
}
