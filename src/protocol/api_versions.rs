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

/// One entry of an ApiVersions response: a key and the versions the broker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersionRange {
    pub api_key: i16,
    pub version_min: i16,
    pub version_max: i16,
}

/// The response body (client side: the load generator picks versions from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiVersionsResponse {
    pub error: ErrorCode,
    pub apis: Vec<ApiVersionRange>,
}

impl ApiVersionsResponse {
    /// Decodes versions 0–3. An error 35 answer comes in the v0 layout
    /// whatever version was asked, and still carries the key list.
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let error = super::error::from_code(r.i16()?);
        let flexible = version >= 3 && error != ErrorCode::UnsupportedVersion;
        let count = r.array_len_v(flexible, 6)?;
        let mut apis = Vec::with_capacity(count);
        for _ in 0..count {
            let api_key = r.i16()?;
            let version_min = r.i16()?;
            let version_max = r.i16()?;
            r.tagged_fields_v(flexible)?;
            apis.push(ApiVersionRange { api_key, version_min, version_max });
        }
        Ok(Self { error, apis })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_round_trips_through_our_encoder() {
        for version in 0..=3 {
            let mut w = Writer::new();
            encode_response(&mut w, version, ErrorCode::None);
            let mut r = Reader::new(w.into_bytes());
            let response = ApiVersionsResponse::decode(&mut r, version).unwrap();
            assert_eq!(response.error, ErrorCode::None);
            assert_eq!(response.apis.len(), SUPPORTED_APIS.len());
            assert_eq!(response.apis[0].api_key, SUPPORTED_APIS[0].key as i16);
        }
    }
}
