//! What an S3 error means for ebb: retried inside the backend, or an errno for the engine.
//!
//! A request that fails with 503 `SlowDown`, another 5xx, a request timeout or a broken
//! connection is retried a few times inside the backend ([`super::client`]) and, if it still
//! fails, reaches the engine as `EAGAIN` (throttled by the server), `ETIMEDOUT` or `EIO`, which
//! the engine retries with its own backoff while writers are throttled. Errors that will not
//! pass by themselves map to the errnos the engine holds pages for: `AccessDenied` and bad
//! credentials to `EACCES`, `EntityTooLarge` to `EFBIG`, `NoSuchBucket` and `NoSuchKey` to
//! `ENOENT`, `QuotaExceeded` to `EDQUOT`. The message names the S3 error code, the request
//! and the key.

use std::fmt;
use std::io;

use ebb_core::event::errno;

use crate::backend::errno_error;

/// A failed S3 request, after the backend's own retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct S3Error {
    /// The request, as S3 names it (`UploadPart`, `CompleteMultipartUpload`, ...).
    pub(crate) request: &'static str,
    /// The object key (or the bucket, for bucket requests).
    pub(crate) key: String,
    /// The HTTP status, 0 when no response came (connection refused, timeout).
    pub(crate) status: u16,
    /// The S3 error code (`NoSuchUpload`, `SlowDown`, ...), or a transport description.
    pub(crate) code: String,
    /// The server's message, or the transport error.
    pub(crate) message: String,
    /// The errno the transport gave, when there was no response.
    pub(crate) os_errno: Option<i32>,
}

impl S3Error {
    /// Whether retrying at once may succeed: server overload, server errors, timeouts, broken
    /// connections. Not a full server (507, `InsufficientStorage`): it lasts until someone
    /// frees space, and the engine holds the data and retries it with its own backoff.
    pub(crate) fn retryable(&self) -> bool {
        if self.errno() == errno::ENOSPC {
            return false;
        }
        self.status == 0
            || (500..600).contains(&self.status)
            || matches!(
                self.code.as_str(),
                "SlowDown" | "InternalError" | "RequestTimeout" | "ServiceUnavailable"
            )
    }

    /// The errno the engine sees.
    pub(crate) fn errno(&self) -> i32 {
        errno_for(self.status, &self.code, self.os_errno)
    }

    /// Whether the upload is gone (aborted, expired, or never existed).
    pub(crate) fn is_no_such_upload(&self) -> bool {
        self.code == "NoSuchUpload"
    }

    /// Whether the object (or bucket) does not exist.
    pub(crate) fn is_not_found(&self) -> bool {
        self.status == 404 || matches!(self.code.as_str(), "NoSuchKey" | "NotFound")
    }

    /// The error as `std::io::Error` with its errno (see [`crate::errno_of`]).
    pub(crate) fn into_io(self) -> io::Error {
        let errno = self.errno();
        errno_error(errno, self.to_string())
    }
}

impl fmt::Display for S3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.status == 0 {
            write!(f, "S3 {} of {:?}: {} ({})", self.request, self.key, self.message, self.code)
        } else {
            write!(
                f,
                "S3 {} of {:?}: {} (HTTP {}): {}",
                self.request, self.key, self.code, self.status, self.message
            )
        }
    }
}

/// The errno for an S3 error code and HTTP status (`os_errno`: the transport's own, when no
/// response came).
pub(crate) fn errno_for(status: u16, code: &str, os_errno: Option<i32>) -> i32 {
    match code {
        "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccountProblem"
        | "AllAccessDisabled" | "ExpiredToken" | "InvalidToken" | "TokenRefreshRequired"
        // versitygw's answer to an unknown access key (AWS says InvalidAccessKeyId).
        | "XAdminUserNotFound" => {
            return errno::EACCES;
        }
        "EntityTooLarge" => return errno::EFBIG,
        "NoSuchBucket" | "NoSuchKey" => return errno::ENOENT,
        "QuotaExceeded" => return errno::EDQUOT,
        // versitygw's answer when its disk is full (HTTP 507).
        "InsufficientStorage" => return errno::ENOSPC,
        "SlowDown" | "ServiceUnavailable" => return errno::EAGAIN,
        "RequestTimeout" => return errno::ETIMEDOUT,
        _ => {}
    }
    match status {
        // No response at all: the connection failed or broke, an outage (retried until the
        // backend's retry_timeout_secs), whatever the transport said.
        0 => os_errno.unwrap_or(errno::ECONNRESET),
        403 => errno::EACCES,
        404 => errno::ENOENT,
        503 => errno::EAGAIN,
        507 => errno::ENOSPC,
        _ => errno::EIO,
    }
}

/// The text of the first `<tag>...</tag>` element in `xml`, with XML entities decoded.
pub(crate) fn xml_text(xml: &str, tag: &str) -> Option<String> {
    xml_texts(xml, tag).into_iter().next()
}

/// The texts of every `<tag>...</tag>` element in `xml`, in order, entities decoded. S3's
/// responses put no attributes on the elements read here, and nest none of the same name.
pub(crate) fn xml_texts(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut texts = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        texts.push(xml_unescape(&after[..end]));
        rest = &after[end + close.len()..];
    }
    texts
}

/// Decodes the five named XML entities and numeric character references.
fn xml_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp..];
        let Some(semi) = after.find(';') else {
            out.push_str(after);
            return out;
        };
        let entity = &after[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(character) => {
                out.push(character);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(status: u16, code: &str) -> S3Error {
        S3Error {
            request: "UploadPart",
            key: "dir/file".to_owned(),
            status,
            code: code.to_owned(),
            message: "the server said no".to_owned(),
            os_errno: None,
        }
    }

    #[test]
    fn errors_that_will_not_pass_map_to_errnos_the_engine_holds() {
        assert_eq!(error(403, "AccessDenied").errno(), errno::EACCES);
        assert_eq!(error(403, "InvalidAccessKeyId").errno(), errno::EACCES);
        assert_eq!(error(403, "SignatureDoesNotMatch").errno(), errno::EACCES);
        assert_eq!(error(400, "EntityTooLarge").errno(), errno::EFBIG);
        assert_eq!(error(404, "NoSuchBucket").errno(), errno::ENOENT);
        assert_eq!(error(404, "NoSuchKey").errno(), errno::ENOENT);
        assert_eq!(error(507, "InsufficientStorage").errno(), errno::ENOSPC);
        assert_eq!(error(507, "").errno(), errno::ENOSPC, "a full server without a code");
        assert!(!error(507, "").retryable(), "a full server retried at once");
        for held in ["AccessDenied", "EntityTooLarge", "NoSuchBucket", "InsufficientStorage"] {
            let e = error(400, held);
            assert!(!e.retryable(), "{held} retried");
            let errno = e.errno();
            let core = ebb_core::IoError { errno };
            assert!(!core.may_pass(), "{held} (errno {errno}) would not be held by the core");
        }
    }

    #[test]
    fn overload_and_server_errors_are_retried_then_passed_on_as_errors_that_may_pass() {
        let slow_down = error(503, "SlowDown");
        assert!(slow_down.retryable());
        assert_eq!(slow_down.errno(), errno::EAGAIN);
        let internal = error(500, "InternalError");
        assert!(internal.retryable());
        assert_eq!(internal.errno(), errno::EIO);
        let timeout = error(400, "RequestTimeout");
        assert!(timeout.retryable());
        assert_eq!(timeout.errno(), errno::ETIMEDOUT);
        let refused = S3Error { status: 0, os_errno: Some(111), ..error(0, "connection") };
        assert!(refused.retryable());
        assert_eq!(refused.errno(), 111);
        let broken = error(0, "transport");
        assert_eq!(broken.errno(), errno::ECONNRESET, "no response is an outage, not EIO");
        for e in [slow_down, internal, timeout, refused, broken] {
            assert!(ebb_core::IoError { errno: e.errno() }.may_pass(), "{e} held");
        }
        assert!(!error(400, "InvalidArgument").retryable());
        assert!(!error(404, "NoSuchUpload").retryable());
    }

    #[test]
    fn the_message_names_the_code_the_request_and_the_key() {
        let io = error(403, "AccessDenied").into_io();
        let text = io.to_string();
        assert!(text.contains("AccessDenied"), "{text}");
        assert!(text.contains("UploadPart"), "{text}");
        assert!(text.contains("dir/file"), "{text}");
        assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(crate::errno_of(&io), Some(errno::EACCES));
    }

    #[test]
    fn xml_elements_and_entities() {
        let body = "<Error><Code>NoSuchUpload</Code><Message>a &lt;b&gt; &amp; &quot;c&quot; \
                    &#65;&#x42;</Message></Error>";
        assert_eq!(xml_text(body, "Code").as_deref(), Some("NoSuchUpload"));
        assert_eq!(xml_text(body, "Message").as_deref(), Some("a <b> & \"c\" AB"));
        assert_eq!(xml_text(body, "Missing"), None);
        let list = "<R><Upload><Key>a</Key></Upload><Upload><Key>b&amp;c</Key></Upload></R>";
        assert_eq!(xml_texts(list, "Key"), ["a", "b&c"]);
        assert_eq!(xml_unescape("odd & ends &bogus; x"), "odd & ends &bogus; x");
    }
}
