//! ApiVersions (key 18), versions 0–3. The response header is always v0, and
//! an unsupported version is answered in the v0 layout with error 35 and the
//! key list, so the client can retry with a version we know.

use super::{DecodeResult, ErrorCode, Reader, Writer, SUPPORTED_APIS};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiVersionsRequest {
    pub client_software_name: Option<String>,
    pub client_software_version: Option<String>,
}

impl ApiVersionsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        if version < 3 {
            return Ok(Self::default());
        }
        let client_software_name = r.compact_nullable_string()?;
        let client_software_version = r.compact_nullable_string()?;
        r.tagged_fields()?;
        Ok(Self { client_software_name, client_software_version })
    }
}

/// Encodes the body of the response (after the v0 header).
pub fn encode_response(w: &mut Writer, version: i16, error: ErrorCode) {
    let flexible = version >= 3;
    w.i16(error.code());
    w.array_len_v(SUPPORTED_APIS.len(), flexible);
    for api in SUPPORTED_APIS {
        w.i16(api.key as i16);
        w.i16(api.version_min);
        w.i16(api.version_max);
        w.tagged_fields_v(flexible);
    }
    if version >= 1 {
        w.i32(0); // throttle_time_ms
    }
    w.tagged_fields_v(flexible);
}
