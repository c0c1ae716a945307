//! ApiVersions: what we serve. Always a v0 response header.

use super::{respond, response, Outcome};
use crate::protocol::api_versions::{encode_response, ApiVersionsRequest};
use crate::protocol::{ApiKey, DecodeResult, ErrorCode, Reader, Request, Writer};

pub fn handle(request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    ApiVersionsRequest::decode(reader, version)?;
    let mut w = response(request);
    encode_response(&mut w, version, ErrorCode::None);
    Ok(respond(w))
}

/// An ApiVersions request of a version we do not know: error 35 in the v0
/// layout with the full key list, so the client can pick a version.
pub fn unsupported_version(correlation_id: i32) -> Outcome {
    let mut w = Writer::new();
    w.i32(correlation_id);
    encode_response(&mut w, 0, ErrorCode::UnsupportedVersion);
    let _ = ApiKey::ApiVersions;
    respond(w)
}
