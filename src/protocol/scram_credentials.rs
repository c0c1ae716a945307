//! DescribeUserScramCredentials (key 50) and AlterUserScramCredentials
//! (key 51), version 0, both directions; flexible (KIP-554). Credentials
//! arrive salted: the client sends the salt and the salted password, the
//! broker keeps StoredKey and ServerKey (`security::scram`).
//!
//! ```text
//! Describe  request   users nullable [name string]
//!           response  throttle_time_ms i32, error_code i16, error_message nullable string,
//!                     results [user string, error_code i16, error_message nullable string,
//!                              credential_infos [mechanism i8, iterations i32]]
//! Alter     request   deletions [name string, mechanism i8],
//!                     upsertions [name string, mechanism i8, iterations i32,
//!                                 salt bytes, salted_password bytes]
//!           response  throttle_time_ms i32,
//!                     results [user string, error_code i16, error_message nullable string]
//! ```

use bytes::Bytes;

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MAX: i16 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeUserScramCredentialsRequest {
    /// `None` (or empty): every user.
    pub users: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeUserScramCredentialsResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub results: Vec<DescribedUser>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedUser {
    pub user: String,
    pub error: ErrorCode,
    pub error_message: Option<String>,
    /// (mechanism, iterations).
    pub credentials: Vec<(i8, i32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterUserScramCredentialsRequest {
    /// (user, mechanism).
    pub deletions: Vec<(String, i8)>,
    pub upsertions: Vec<ScramUpsertion>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramUpsertion {
    pub name: String,
    pub mechanism: i8,
    pub iterations: i32,
    pub salt: Bytes,
    pub salted_password: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterUserScramCredentialsResponse {
    pub throttle_time_ms: i32,
    /// (user, error, message).
    pub results: Vec<(String, ErrorCode, Option<String>)>,
}

/// A compact string (1 byte) and tagged fields (1 byte) at least.
const NAME_BYTES_MIN: usize = 2;

impl DescribeUserScramCredentialsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::DescribeUserScramCredentials, version)?;
        let users = match r.nullable_array_len_v(true, NAME_BYTES_MIN)? {
            None => None,
            Some(count) => {
                let mut users = Vec::with_capacity(count);
                for _ in 0..count {
                    users.push(r.string_v(true)?);
                    r.tagged_fields()?;
                }
                Some(users)
            }
        };
        r.tagged_fields()?;
        Ok(Self { users })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::DescribeUserScramCredentials, version).is_ok());
        w.nullable_array_len_v(self.users.as_ref().map(Vec::len), true);
        for user in self.users.iter().flatten() {
            w.string_v(user, true);
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }
}

impl DescribeUserScramCredentialsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::DescribeUserScramCredentials, version).is_ok());
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.nullable_string_v(self.error_message.as_deref(), true);
        w.array_len_v(self.results.len(), true);
        for result in &self.results {
            w.string_v(&result.user, true);
            w.i16(result.error.code());
            w.nullable_string_v(result.error_message.as_deref(), true);
            w.array_len_v(result.credentials.len(), true);
            for (mechanism, iterations) in &result.credentials {
                w.i8(*mechanism);
                w.i32(*iterations);
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::DescribeUserScramCredentials, version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let error_message = r.nullable_string_v(true)?;
        let count = r.array_len_v(true, 5)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            let user = r.string_v(true)?;
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string_v(true)?;
            let infos = r.array_len_v(true, 6)?;
            let mut credentials = Vec::with_capacity(infos);
            for _ in 0..infos {
                credentials.push((r.i8()?, r.i32()?));
                r.tagged_fields()?;
            }
            r.tagged_fields()?;
            results.push(DescribedUser { user, error, error_message, credentials });
        }
        r.tagged_fields()?;
        Ok(Self { throttle_time_ms, error, error_message, results })
    }
}

impl AlterUserScramCredentialsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::AlterUserScramCredentials, version)?;
        let count = r.array_len_v(true, NAME_BYTES_MIN + 1)?;
        let mut deletions = Vec::with_capacity(count);
        for _ in 0..count {
            deletions.push((r.string_v(true)?, r.i8()?));
            r.tagged_fields()?;
        }
        let count = r.array_len_v(true, NAME_BYTES_MIN + 7)?;
        let mut upsertions = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string_v(true)?;
            let mechanism = r.i8()?;
            let iterations = r.i32()?;
            let salt = r.bytes_v(true)?;
            let salted_password = r.bytes_v(true)?;
            r.tagged_fields()?;
            upsertions.push(ScramUpsertion { name, mechanism, iterations, salt, salted_password });
        }
        r.tagged_fields()?;
        Ok(Self { deletions, upsertions })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::AlterUserScramCredentials, version).is_ok());
        w.array_len_v(self.deletions.len(), true);
        for (name, mechanism) in &self.deletions {
            w.string_v(name, true);
            w.i8(*mechanism);
            w.tagged_fields_v(true);
        }
        w.array_len_v(self.upsertions.len(), true);
        for u in &self.upsertions {
            w.string_v(&u.name, true);
            w.i8(u.mechanism);
            w.i32(u.iterations);
            w.bytes_v(&u.salt, true);
            w.bytes_v(&u.salted_password, true);
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }
}

impl AlterUserScramCredentialsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check(ApiKey::AlterUserScramCredentials, version).is_ok());
        w.i32(self.throttle_time_ms);
        w.array_len_v(self.results.len(), true);
        for (user, error, message) in &self.results {
            w.string_v(user, true);
            w.i16(error.code());
            w.nullable_string_v(message.as_deref(), true);
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check(ApiKey::AlterUserScramCredentials, version)?;
        let throttle_time_ms = r.i32()?;
        let count = r.array_len_v(true, 4)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            let user = r.string_v(true)?;
            let error = error::from_code(r.i16()?);
            let message = r.nullable_string_v(true)?;
            r.tagged_fields()?;
            results.push((user, error, message));
        }
        r.tagged_fields()?;
        Ok(Self { throttle_time_ms, results })
    }
}

fn check(api: ApiKey, version: i16) -> DecodeResult<()> {
    if (0..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: api as i16, version })
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::messages::{
        alter_user_scram_credentials_request as kp_alter_req, alter_user_scram_credentials_response as kp_alter_resp,
        describe_user_scram_credentials_request as kp_desc_req,
        describe_user_scram_credentials_response as kp_desc_resp,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    fn ours<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    fn theirs<T: Encodable>(message: &T) -> Bytes {
        let mut out = BytesMut::new();
        message.encode(&mut out, 0).expect("kafka-protocol encodes");
        out.freeze()
    }

    fn s(text: &'static str) -> StrBytes {
        StrBytes::from_static_str(text)
    }

    #[test]
    fn describe_user_scram_credentials_matches_kafka_protocol_encoding_both_ways() {
        for users in [None, Some(vec!["alice".to_string(), "bob".to_string()])] {
            let request = DescribeUserScramCredentialsRequest { users: users.clone() };
            let bytes = ours(|w| request.encode(w, 0));
            let kafka = kp_desc_req::DescribeUserScramCredentialsRequest::default().with_users(users.map(|u| {
                u.iter().map(|n| kp_desc_req::UserName::default().with_name(StrBytes::from_string(n.clone()))).collect()
            }));
            assert_eq!(bytes, theirs(&kafka));
            assert_eq!(DescribeUserScramCredentialsRequest::decode(&mut Reader::new(bytes), 0).unwrap(), request);
        }
        let response = DescribeUserScramCredentialsResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            error_message: None,
            results: vec![
                DescribedUser {
                    user: "alice".into(),
                    error: ErrorCode::None,
                    error_message: None,
                    credentials: vec![(1, 4096), (2, 8192)],
                },
                DescribedUser {
                    user: "bob".into(),
                    error: ErrorCode::ResourceNotFound,
                    error_message: Some("no credentials".into()),
                    credentials: vec![],
                },
            ],
        };
        let bytes = ours(|w| response.encode(w, 0));
        let info = |m, i| kp_desc_resp::CredentialInfo::default().with_mechanism(m).with_iterations(i);
        let kafka =
            kp_desc_resp::DescribeUserScramCredentialsResponse::default().with_error_message(None).with_results(vec![
                kp_desc_resp::DescribeUserScramCredentialsResult::default()
                    .with_user(s("alice"))
                    .with_error_message(None)
                    .with_credential_infos(vec![info(1, 4096), info(2, 8192)]),
                kp_desc_resp::DescribeUserScramCredentialsResult::default()
                    .with_user(s("bob"))
                    .with_error_code(ErrorCode::ResourceNotFound.code())
                    .with_error_message(Some(s("no credentials"))),
            ]);
        assert_eq!(bytes, theirs(&kafka));
        assert_eq!(DescribeUserScramCredentialsResponse::decode(&mut Reader::new(bytes), 0).unwrap(), response);
    }

    #[test]
    fn alter_user_scram_credentials_matches_kafka_protocol_encoding_both_ways() {
        let request = AlterUserScramCredentialsRequest {
            deletions: vec![("bob".into(), 1)],
            upsertions: vec![ScramUpsertion {
                name: "alice".into(),
                mechanism: 2,
                iterations: 8192,
                salt: Bytes::from_static(b"salt"),
                salted_password: Bytes::from_static(b"salted"),
            }],
        };
        let bytes = ours(|w| request.encode(w, 0));
        let kafka = kp_alter_req::AlterUserScramCredentialsRequest::default()
            .with_deletions(vec![kp_alter_req::ScramCredentialDeletion::default()
                .with_name(s("bob"))
                .with_mechanism(1)])
            .with_upsertions(vec![kp_alter_req::ScramCredentialUpsertion::default()
                .with_name(s("alice"))
                .with_mechanism(2)
                .with_iterations(8192)
                .with_salt(Bytes::from_static(b"salt"))
                .with_salted_password(Bytes::from_static(b"salted"))]);
        assert_eq!(bytes, theirs(&kafka));
        assert_eq!(AlterUserScramCredentialsRequest::decode(&mut Reader::new(bytes.clone()), 0).unwrap(), request);
        for cut in 0..bytes.len() {
            assert!(AlterUserScramCredentialsRequest::decode(&mut Reader::new(bytes.slice(..cut)), 0).is_err());
        }
        let response = AlterUserScramCredentialsResponse {
            throttle_time_ms: 0,
            results: vec![("alice".into(), ErrorCode::UnacceptableCredential, Some("iterations".into()))],
        };
        let bytes = ours(|w| response.encode(w, 0));
        let kafka = kp_alter_resp::AlterUserScramCredentialsResponse::default().with_results(vec![
            kp_alter_resp::AlterUserScramCredentialsResult::default()
                .with_user(s("alice"))
                .with_error_code(ErrorCode::UnacceptableCredential.code())
                .with_error_message(Some(s("iterations"))),
        ]);
        assert_eq!(bytes, theirs(&kafka));
        assert_eq!(AlterUserScramCredentialsResponse::decode(&mut Reader::new(bytes), 0).unwrap(), response);
    }
}
