//! The S3 requests the backend makes: signed by `rusty-s3` (SigV4 presigned URLs, no IO),
//! sent by `ureq` (blocking, a pool of kept-alive connections, timeouts per read and write),
//! retried a few times with exponential backoff and jitter when the server is overloaded or
//! failing, and counted by kind.
//!
//! Request bodies are sent straight from the caller's buffer and response bodies read straight
//! into it: the client holds no data of its own.

use super::meta::{self, MetaCache};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusty_s3::actions::{CreateMultipartUpload, ListObjectsV2};
use rusty_s3::{Bucket, Credentials, S3Action};
use ureq::http;
use url::Url;

use super::error::{S3Error, xml_text, xml_texts};
pub(crate) use super::kind::Kind;
use crate::backend::{SourceReader, WriteSource};

/// How long a signed URL stays valid: long enough for a slow part upload and its retries.
const SIGNATURE_SECONDS: u64 = 3600;
/// First retry delay; each retry doubles it, and jitter draws the delay from half to one and a
/// half times that.
const RETRY_DELAY_FIRST: Duration = Duration::from_millis(50);
/// Largest error body read (S3 error documents are a few hundred bytes).
const ERROR_BODY_BYTES_MAX: u64 = 64 << 10;

/// The backend's counters (atomics: `counters()` reads them while IO runs).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: [AtomicU64; Kind::ALL.len()],
    retries: AtomicU64,
    bytes_uploaded: AtomicU64,
    bytes_copied: AtomicU64,
    bytes_downloaded: AtomicU64,
    pub(crate) uploads_lost: AtomicU64,
    pub(crate) uploads_aborted_at_start: AtomicU64,
    pub(crate) renames_finished_at_start: AtomicU64,
}

impl Counters {
    /// Every counter by name, in a stable order.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut all: Vec<(&'static str, u64)> = Kind::ALL
            .iter()
            .map(|kind| (kind.counter(), self.requests[*kind as usize].load(Ordering::Relaxed)))
            .collect();
        for (name, counter) in [
            ("retries", &self.retries),
            ("bytes_uploaded", &self.bytes_uploaded),
            ("bytes_copied", &self.bytes_copied),
            ("bytes_downloaded", &self.bytes_downloaded),
            ("uploads_lost", &self.uploads_lost),
            ("uploads_aborted_at_start", &self.uploads_aborted_at_start),
            ("renames_finished_at_start", &self.renames_finished_at_start),
        ] {
            all.push((name, counter.load(Ordering::Relaxed)));
        }
        all
    }
}

/// What HeadObject says of an object.
struct Head {
    size: u64,
    etag: String,
    last_modified: Option<String>,
}

impl Head {
    fn modified(&self) -> Option<std::time::SystemTime> {
        let text = self.last_modified.as_deref()?;
        let zoned = jiff::fmt::rfc2822::parse(text).ok()?;
        Some(std::time::SystemTime::from(zoned.timestamp()))
    }
}

/// One upload in progress, as ListMultipartUploads reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedUpload {
    pub(crate) key: String,
    pub(crate) upload_id: String,
}

/// One page of ListObjectsV2 with a delimiter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    /// Keys and sizes of the objects.
    pub(crate) objects: Vec<(String, u64)>,
    /// The common prefixes ("directories").
    pub(crate) prefixes: Vec<String>,
    /// The token for the next page, if the listing goes on.
    pub(crate) next: Option<String>,
}

/// A bucket on a server, with credentials and an HTTP connection pool.
pub(crate) struct Client {
    agent: ureq::Agent,
    bucket: Bucket,
    credentials: Option<Credentials>,
    /// Immediate retries of a retryable failure before it reaches the caller.
    retries: u32,
    pub(crate) counters: Counters,
    /// What the server said of keys lately, kept up to date by this client's own requests.
    pub(crate) meta: MetaCache,
    /// The state of the jitter's random numbers (xorshift), seeded from the OS.
    jitter: AtomicU64,
}

/// What a request sends.
struct Request<'a> {
    kind: Kind,
    key: &'a str,
    method: http::Method,
    url: Url,
    headers: Vec<(&'static str, String)>,
    body: Option<Body<'a>>,
}

/// A request's body: bytes in a buffer, or a source copied from as the request goes out.
#[derive(Clone, Copy)]
enum Body<'a> {
    Bytes(&'a [u8]),
    Source(&'a dyn WriteSource),
}

impl Client {
    /// A client of `bucket`; `timeout` bounds each read and write on a connection.
    pub(crate) fn new(
        bucket: Bucket,
        credentials: Option<Credentials>,
        retries: u32,
        timeout: Duration,
        metadata_ttl: Duration,
    ) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_per_write(Some(timeout))
            .max_idle_connections(256)
            .max_idle_connections_per_host(256)
            .user_agent("ebb")
            .build();
        let seed = RandomState::new().build_hasher().finish() | 1;
        Client {
            agent: config.into(),
            bucket,
            credentials,
            retries,
            counters: Counters::default(),
            meta: MetaCache::new(metadata_ttl),
            jitter: AtomicU64::new(seed),
        }
    }

    /// The bucket's name.
    pub(crate) fn bucket_name(&self) -> &str {
        self.bucket.name()
    }

    fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    fn signed<'a>(&self, action: &impl S3Action<'a>) -> Url {
        action.sign(Duration::from_secs(SIGNATURE_SECONDS))
    }

    /// Checks that the bucket exists and the credentials may use it: a listing of at most one
    /// key (a HEAD would do, but its reply has no body to name the error code in).
    pub(crate) fn check_bucket(&self, prefix: &str) -> Result<(), S3Error> {
        let mut action = ListObjectsV2::new(&self.bucket, self.credentials());
        action.with_prefix(prefix);
        action.with_max_keys(1);
        let url = self.signed(&action);
        let name = self.bucket.name().to_owned();
        self.send_for_body(Request::new(Kind::CheckBucket, &name, http::Method::GET, url)).map(drop)
    }

    /// The object's size, `None` if it does not exist (from the metadata cache if fresh).
    pub(crate) fn head_object(&self, key: &str) -> Result<Option<u64>, S3Error> {
        Ok(self.head_object_meta(key)?.map(|(size, _)| size))
    }

    /// The object's size and ETag (as the server quotes it), `None` if it does not exist;
    /// always asked of the server.
    pub(crate) fn head_object_etag(&self, key: &str) -> Result<Option<(u64, String)>, S3Error> {
        Ok(self.head(key)?.map(|head| (head.size, head.etag)))
    }

    /// The object's size and Last-Modified time, `None` if it does not exist (from the
    /// metadata cache if fresh).
    pub(crate) fn head_object_meta(&self, key: &str) -> Result<meta::Head, S3Error> {
        if let Some(head) = self.meta.head(key) {
            return Ok(head);
        }
        Ok(self.head(key)?.map(|head| (head.size, head.modified())))
    }

    /// HeadObject, its answer recorded in the metadata cache.
    fn head(&self, key: &str) -> Result<Option<Head>, S3Error> {
        let head = self.head_uncached(key)?;
        self.meta.set_head(key, head.as_ref().map(|head| (head.size, head.modified())));
        Ok(head)
    }

    fn head_uncached(&self, key: &str) -> Result<Option<Head>, S3Error> {
        let url = self.signed(&self.bucket.head_object(self.credentials(), key));
        match self.send(Request::new(Kind::HeadObject, key, http::Method::HEAD, url)) {
            Ok(response) => {
                let header = |name: http::header::HeaderName| {
                    response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
                };
                let size = header(http::header::CONTENT_LENGTH)
                    .and_then(|value| value.parse::<u64>().ok())
                    .ok_or_else(|| {
                        protocol_error(Kind::HeadObject, key, "no Content-Length in the reply")
                    })?;
                let etag = header(http::header::ETAG).unwrap_or_default();
                let last_modified = header(http::header::LAST_MODIFIED);
                Ok(Some(Head { size, etag, last_modified }))
            }
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reads the object's bytes from `offset` into `buf`, returning how many it got: fewer
    /// only where the object ends (0 at or past its end).
    pub(crate) fn get_range(
        &self,
        key: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, S3Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        let url = self.signed(&self.bucket.get_object(self.credentials(), key));
        let last = offset + buf.len() as u64 - 1;
        let mut request = Request::new(Kind::GetObject, key, http::Method::GET, url);
        request.headers.push(("range", format!("bytes={offset}-{last}")));
        let response = match self.send(request) {
            Ok(response) => response,
            Err(error) if error.status == 416 => return Ok(0),
            Err(error) => return Err(error),
        };
        // A server that ignores the range answers 200 with the whole object.
        let skip = if response.status() == http::StatusCode::PARTIAL_CONTENT { 0 } else { offset };
        let mut reader = response.into_body().into_reader();
        if skip > 0 {
            io::copy(&mut (&mut reader).take(skip), &mut io::sink())
                .map_err(|e| transport_error(Kind::GetObject, key, &e))?;
        }
        let mut filled = 0;
        while filled < buf.len() {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(count) => filled += count,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(transport_error(Kind::GetObject, key, &e)),
            }
        }
        self.counters.bytes_downloaded.fetch_add(filled as u64, Ordering::Relaxed);
        Ok(filled)
    }

    /// Creates or replaces the whole object with `data`.
    pub(crate) fn put_object(&self, key: &str, data: &[u8]) -> Result<(), S3Error> {
        let url = self.signed(&self.bucket.put_object(self.credentials(), key));
        let mut request = Request::new(Kind::PutObject, key, http::Method::PUT, url);
        request.body = Some(Body::Bytes(data));
        self.send(request)?;
        self.counters.bytes_uploaded.fetch_add(data.len() as u64, Ordering::Relaxed);
        // The object, made now (the server's Last-Modified may differ by its clock): the next
        // stat needs no request, and its directory's listing stays whole.
        let head =
            (!key.ends_with('/')).then(|| (data.len() as u64, Some(std::time::SystemTime::now())));
        self.meta.made(key, head);
        Ok(())
    }

    /// Deletes the object (S3 answers success for a missing one too).
    pub(crate) fn delete_object(&self, key: &str) -> Result<(), S3Error> {
        let url = self.signed(&self.bucket.delete_object(self.credentials(), key));
        self.send(Request::new(Kind::DeleteObject, key, http::Method::DELETE, url))?;
        self.meta.deleted(key);
        Ok(())
    }

    /// Copies the object `source` to `key` on the server (objects up to 5 GiB).
    pub(crate) fn copy_object(&self, source: &str, key: &str) -> Result<(), S3Error> {
        let mut action = self.bucket.put_object(self.credentials(), key);
        let copy_source = self.copy_source(source);
        action.headers_mut().insert("x-amz-copy-source", copy_source.clone());
        let url = self.signed(&action);
        let mut request = Request::new(Kind::CopyObject, key, http::Method::PUT, url);
        request.headers.push(("x-amz-copy-source", copy_source));
        request.body = Some(Body::Bytes(&[]));
        let body = self.send_for_body(request)?;
        self.meta.written(key);
        check_error_body(Kind::CopyObject, key, &body)
    }

    /// One page of the keys under `prefix`, split at `delimiter` (`/` for directories).
    pub(crate) fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation: Option<&str>,
    ) -> Result<Listing, S3Error> {
        let mut action = ListObjectsV2::new(&self.bucket, self.credentials());
        action.with_prefix(prefix);
        if let Some(delimiter) = delimiter {
            action.with_delimiter(delimiter);
        }
        if let Some(token) = continuation {
            action.with_continuation_token(token);
        }
        let url = self.signed(&action);
        let body =
            self.send_for_body(Request::new(Kind::ListObjects, prefix, http::Method::GET, url))?;
        let parsed = ListObjectsV2::parse_response(&body)
            .map_err(|e| protocol_error(Kind::ListObjects, prefix, &e.to_string()))?;
        if delimiter == Some("/") {
            // What a directory's listing says of its entries: `ls -l` then stats from the cache.
            for content in &parsed.contents {
                let modified = content
                    .last_modified
                    .as_deref()
                    .and_then(|text| text.parse::<jiff::Timestamp>().ok())
                    .map(std::time::SystemTime::from);
                self.meta.set_head(&content.key, Some((content.size.unwrap_or(0), modified)));
            }
            for common in &parsed.common_prefixes {
                self.meta.set_dir(common.prefix.trim_end_matches('/'), true);
            }
        }
        Ok(Listing {
            objects: parsed.contents.into_iter().map(|c| (c.key, c.size.unwrap_or(0))).collect(),
            prefixes: parsed.common_prefixes.into_iter().map(|p| p.prefix).collect(),
            next: parsed.next_continuation_token,
        })
    }

    /// Starts a multipart upload of `key`, returning its id.
    pub(crate) fn create_upload(&self, key: &str) -> Result<String, S3Error> {
        let url = self.signed(&self.bucket.create_multipart_upload(self.credentials(), key));
        let mut request = Request::new(Kind::CreateMultipartUpload, key, http::Method::POST, url);
        request.body = Some(Body::Bytes(&[]));
        let body = self.send_for_body(request)?;
        let parsed = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| protocol_error(Kind::CreateMultipartUpload, key, &e.to_string()))?;
        Ok(parsed.upload_id().to_owned())
    }

    /// Uploads `data` as part `part` of the upload, returning the part's ETag.
    pub(crate) fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: u32,
        data: &[u8],
    ) -> Result<String, S3Error> {
        self.upload_part_body(key, upload_id, part, Body::Bytes(data), data.len())
    }

    /// Uploads `source`'s bytes as part `part` of the upload, copied from it as the request
    /// goes out (again on a retry), returning the part's ETag.
    pub(crate) fn upload_part_from(
        &self,
        key: &str,
        upload_id: &str,
        part: u32,
        source: &dyn WriteSource,
    ) -> Result<String, S3Error> {
        self.upload_part_body(key, upload_id, part, Body::Source(source), source.len())
    }

    fn upload_part_body(
        &self,
        key: &str,
        upload_id: &str,
        part: u32,
        body: Body<'_>,
        len: usize,
    ) -> Result<String, S3Error> {
        let action = self.bucket.upload_part(self.credentials(), key, part_number(part), upload_id);
        let url = self.signed(&action);
        let mut request = Request::new(Kind::UploadPart, key, http::Method::PUT, url);
        request.body = Some(body);
        let response = self.send(request)?;
        let etag = response
            .headers()
            .get(http::header::ETAG)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| protocol_error(Kind::UploadPart, key, "no ETag in the reply"))?;
        self.counters.bytes_uploaded.fetch_add(len as u64, Ordering::Relaxed);
        Ok(etag)
    }

    /// Makes part `part` of the upload a server-side copy of `source`'s bytes `range`,
    /// returning the part's ETag.
    pub(crate) fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part: u32,
        source: &str,
        range: std::ops::Range<u64>,
    ) -> Result<String, S3Error> {
        let mut action =
            self.bucket.upload_part(self.credentials(), key, part_number(part), upload_id);
        let copy_source = self.copy_source(source);
        let copy_range = format!("bytes={}-{}", range.start, range.end - 1);
        action.headers_mut().insert("x-amz-copy-source", copy_source.clone());
        action.headers_mut().insert("x-amz-copy-source-range", copy_range.clone());
        let url = self.signed(&action);
        let mut request = Request::new(Kind::UploadPartCopy, key, http::Method::PUT, url);
        request.headers.push(("x-amz-copy-source", copy_source));
        request.headers.push(("x-amz-copy-source-range", copy_range));
        request.body = Some(Body::Bytes(&[]));
        let body = self.send_for_body(request)?;
        check_error_body(Kind::UploadPartCopy, key, &body)?;
        let etag = xml_text(&body, "ETag")
            .ok_or_else(|| protocol_error(Kind::UploadPartCopy, key, "no ETag in the reply"))?;
        self.counters.bytes_copied.fetch_add(range.end - range.start, Ordering::Relaxed);
        Ok(etag)
    }

    /// Completes the upload with parts 1..=etags.len() (the n-th ETag is part n).
    pub(crate) fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
    ) -> Result<(), S3Error> {
        let action = self.bucket.complete_multipart_upload(
            self.credentials(),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = self.signed(&action);
        let xml = action.body();
        let mut request = Request::new(Kind::CompleteMultipartUpload, key, http::Method::POST, url);
        request.body = Some(Body::Bytes(xml.as_bytes()));
        // S3 may answer 200 and still fail the completion, in the body.
        let result = self
            .send_for_body(request)
            .and_then(|body| check_error_body(Kind::CompleteMultipartUpload, key, &body));
        self.meta.written(key);
        if let Err(error) = &result
            && !error.is_no_such_upload()
        {
            return result;
        }
        // The object must now carry the ETag this completion gives (S3's multipart ETag: the
        // MD5 of the parts' MD5s, and their count). A retry of a completion whose reply was
        // lost finds the upload gone (NoSuchUpload) although it is done; and versitygw 1.8
        // answers success to the completion of an upload it no longer has, leaving the object
        // as it was. Where the parts' ETags are not MD5s, the reply is all there is.
        let Some(expected) = multipart_etag(etags) else { return result };
        let now = self.head_object_etag(key)?.map(|(_, etag)| etag.trim_matches('"').to_owned());
        if now.as_deref() == Some(expected.as_str()) {
            return Ok(());
        }
        Err(S3Error {
            request: Kind::CompleteMultipartUpload.name(),
            key: key.to_owned(),
            status: 404,
            code: "NoSuchUpload".to_owned(),
            message: format!(
                "the object's ETag is {now:?} after completing upload {upload_id}, not {expected:?}: \
                 the server no longer had the upload"
            ),
            os_errno: None,
        })
    }

    /// Aborts the upload; its parts are deleted. An upload already gone is not an error.
    pub(crate) fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), S3Error> {
        let action = self.bucket.abort_multipart_upload(self.credentials(), key, upload_id);
        let url = self.signed(&action);
        match self.send(Request::new(Kind::AbortMultipartUpload, key, http::Method::DELETE, url)) {
            Ok(_) => Ok(()),
            Err(error) if error.is_no_such_upload() || error.is_not_found() => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Every upload in progress whose key starts with `prefix`.
    pub(crate) fn list_uploads(&self, prefix: &str) -> Result<Vec<ListedUpload>, S3Error> {
        let mut uploads = Vec::new();
        let mut markers: Option<(String, String)> = None;
        loop {
            let mut query: Vec<(&str, &str)> = Vec::new();
            if let Some((key_marker, id_marker)) = &markers {
                query.push(("key-marker", key_marker));
                query.push(("prefix", prefix));
                query.push(("upload-id-marker", id_marker));
            } else {
                query.push(("prefix", prefix));
            }
            query.push(("uploads", ""));
            let url = self.sign_custom(http::Method::GET, &query);
            let request = Request::new(Kind::ListMultipartUploads, prefix, http::Method::GET, url);
            let body = self.send_for_body(request)?;
            for upload in xml_texts(&body, "Upload") {
                if let (Some(key), Some(upload_id)) =
                    (xml_text(&upload, "Key"), xml_text(&upload, "UploadId"))
                {
                    uploads.push(ListedUpload { key, upload_id });
                }
            }
            let truncated = xml_text(&body, "IsTruncated").is_some_and(|text| text == "true");
            let next = xml_text(&body, "NextKeyMarker").zip(xml_text(&body, "NextUploadIdMarker"));
            match next {
                Some(next) if truncated && markers.as_ref() != Some(&next) => markers = Some(next),
                _ => return Ok(uploads),
            }
        }
    }

    /// Signs a bucket-level request rusty-s3 has no action for; `query` sorted by name.
    fn sign_custom(&self, method: http::Method, query: &[(&str, &str)]) -> Url {
        let url = self.bucket.base_url().clone();
        let rusty_method = match method {
            http::Method::GET => rusty_s3::Method::Get,
            http::Method::HEAD => rusty_s3::Method::Head,
            http::Method::PUT => rusty_s3::Method::Put,
            http::Method::POST => rusty_s3::Method::Post,
            _ => rusty_s3::Method::Delete,
        };
        match self.credentials() {
            Some(credentials) => rusty_s3::signing::sign(
                &jiff::Timestamp::now(),
                rusty_method,
                url,
                credentials.key(),
                credentials.secret(),
                credentials.token(),
                self.bucket.region(),
                SIGNATURE_SECONDS,
                query.iter().copied(),
                std::iter::empty(),
            ),
            None => {
                let mut url = url;
                url.query_pairs_mut().extend_pairs(query.iter().copied());
                url
            }
        }
    }

    /// The `x-amz-copy-source` value of `key` in this bucket.
    fn copy_source(&self, key: &str) -> String {
        format!("/{}/{}", self.bucket.name(), percent_encode_key(key))
    }

    /// Sends and reads the whole (small) response body.
    fn send_for_body(&self, request: Request<'_>) -> Result<String, S3Error> {
        let (kind, key) = (request.kind, request.key.to_owned());
        let response = self.send(request)?;
        let mut body = String::new();
        response
            .into_body()
            .into_with_config()
            .limit(16 << 20)
            .reader()
            .read_to_string(&mut body)
            .map_err(|e| transport_error(kind, &key, &e))?;
        Ok(body)
    }

    /// Sends the request, retrying retryable failures with backoff and jitter; a response
    /// other than 2xx becomes an [`S3Error`] with the code from its body.
    fn send(&self, request: Request<'_>) -> Result<http::Response<ureq::Body>, S3Error> {
        let mut attempt = 0;
        loop {
            self.counters.requests[request.kind as usize].fetch_add(1, Ordering::Relaxed);
            let error = match self.execute(&request) {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => response_error(request.kind, request.key, response),
                Err(error) => transport_error_ureq(request.kind, request.key, error),
            };
            if !error.retryable() || self.retries <= attempt {
                return Err(error);
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.backoff(attempt));
            attempt += 1;
        }
    }

    fn execute(&self, request: &Request<'_>) -> Result<http::Response<ureq::Body>, ureq::Error> {
        let mut builder =
            http::Request::builder().method(request.method.clone()).uri(request.url.as_str());
        for (name, value) in &request.headers {
            builder = builder.header(*name, value.as_str());
        }
        match request.body {
            Some(Body::Bytes(body)) => {
                self.agent.run(builder.body(body).map_err(ureq::Error::Http)?)
            }
            Some(Body::Source(source)) => {
                // With its length given, the body goes out as it is read, not chunked.
                let mut reader = SourceReader::new(source);
                let body = ureq::SendBody::from_reader(&mut reader);
                let builder = builder.header(http::header::CONTENT_LENGTH, source.len());
                self.agent.run(builder.body(body).map_err(ureq::Error::Http)?)
            }
            None => self.agent.run(builder.body(()).map_err(ureq::Error::Http)?),
        }
    }

    /// The delay before retry `attempt` (0-based): exponential, with jitter so that clients
    /// throttled together do not return together.
    fn backoff(&self, attempt: u32) -> Duration {
        let base = RETRY_DELAY_FIRST.saturating_mul(1 << attempt.min(10));
        let random = self.next_random();
        let fraction = (random % 1000) as u32;
        base / 2 + base * fraction / 1000
    }

    fn next_random(&self) -> u64 {
        let mut x = self.jitter.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter.store(x, Ordering::Relaxed);
        x
    }
}

impl<'a> Request<'a> {
    fn new(kind: Kind, key: &'a str, method: http::Method, url: Url) -> Request<'a> {
        Request { kind, key, method, url, headers: Vec::new(), body: None }
    }
}

fn part_number(part: u32) -> u16 {
    u16::try_from(part).expect("part numbers are at most 10000")
}

/// The ETag S3 gives an object completed from parts with `etags` (MD5 hex each): the MD5 of
/// their binary MD5s, a dash and the part count. `None` if a part's ETag is not an MD5.
pub(crate) fn multipart_etag(etags: &[String]) -> Option<String> {
    use md5::Digest;
    let mut hasher = md5::Md5::new();
    for etag in etags {
        let hex = etag.trim_matches('"');
        if hex.len() != 32 {
            return None;
        }
        for index in (0..32).step_by(2) {
            hasher.update([u8::from_str_radix(&hex[index..index + 2], 16).ok()?]);
        }
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(format!("{hex}-{}", etags.len()))
}

/// Percent-encodes a key for a URL path or `x-amz-copy-source`, keeping `/`.
pub(crate) fn percent_encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A non-2xx response as an error, with the S3 code and message from its body.
fn response_error(kind: Kind, key: &str, response: http::Response<ureq::Body>) -> S3Error {
    let status = response.status().as_u16();
    let mut body = String::new();
    let _ = response
        .into_body()
        .into_with_config()
        .limit(ERROR_BODY_BYTES_MAX)
        .lossy_utf8(true)
        .reader()
        .read_to_string(&mut body);
    let code = xml_text(&body, "Code").unwrap_or_else(|| match status {
        404 => "NotFound".to_owned(),
        403 => "AccessDenied".to_owned(),
        _ => format!("HTTP{status}"),
    });
    let message = xml_text(&body, "Message").unwrap_or_default();
    S3Error { request: kind.name(), key: key.to_owned(), status, code, message, os_errno: None }
}

/// A 200 response whose body is an error document (CompleteMultipartUpload, copies).
fn check_error_body(kind: Kind, key: &str, body: &str) -> Result<(), S3Error> {
    if !body.contains("<Error>") {
        return Ok(());
    }
    let code = xml_text(body, "Code").unwrap_or_else(|| "InternalError".to_owned());
    let message = xml_text(body, "Message").unwrap_or_default();
    Err(S3Error {
        request: kind.name(),
        key: key.to_owned(),
        status: 200,
        code,
        message,
        os_errno: None,
    })
}

fn transport_error_ureq(kind: Kind, key: &str, error: ureq::Error) -> S3Error {
    let (code, os_errno) = match &error {
        ureq::Error::Timeout(_) => ("timeout", Some(ebb_core::event::errno::ETIMEDOUT)),
        ureq::Error::Io(io) => ("connection", io.raw_os_error()),
        // No answer came: the server could not be reached (an outage for the engine, never
        // EIO at once: issue 34 saw fsync fail one second into a versitygw restart).
        ureq::Error::ConnectionFailed => ("connection", Some(ebb_core::event::errno::ECONNREFUSED)),
        ureq::Error::HostNotFound => ("connection", Some(ebb_core::event::errno::EHOSTUNREACH)),
        _ => ("transport", None),
    };
    S3Error {
        request: kind.name(),
        key: key.to_owned(),
        status: 0,
        code: code.to_owned(),
        message: error.to_string(),
        os_errno,
    }
}

fn transport_error(kind: Kind, key: &str, error: &io::Error) -> S3Error {
    S3Error {
        request: kind.name(),
        key: key.to_owned(),
        status: 0,
        code: "connection".to_owned(),
        message: error.to_string(),
        os_errno: error.raw_os_error(),
    }
}

/// A reply S3 would not send (missing header, unparsable body): not retried.
fn protocol_error(kind: Kind, key: &str, what: &str) -> S3Error {
    S3Error {
        request: kind.name(),
        key: key.to_owned(),
        status: 200,
        code: "MalformedReply".to_owned(),
        message: what.to_owned(),
        os_errno: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_etag_is_the_md5_of_the_part_md5s() {
        // Two parts whose bytes are "a" and "b": MD5s 0cc175b9... and 92eb5ffe...; the MD5 of
        // their 32 binary bytes, as computed by `printf` and `md5sum`.
        let etags = [
            "\"0cc175b9c0f1b6a831c399e269772661\"".to_owned(),
            "92eb5ffee6ae2fec3ad71c777531578f".to_owned(),
        ];
        assert_eq!(multipart_etag(&etags).as_deref(), Some("96e024ba2074fe77e8e965ba43a704be-2"));
        assert_eq!(multipart_etag(&["not-an-md5".to_owned()]), None);
    }

    #[test]
    fn keys_are_percent_encoded_but_slashes_kept() {
        assert_eq!(percent_encode_key("a/b c/ü+&.txt"), "a/b%20c/%C3%BC%2B%26.txt");
    }

    #[test]
    fn backoff_doubles_with_jitter_inside_half_to_one_and_a_half() {
        let bucket = Bucket::new(
            "http://127.0.0.1:1".parse().unwrap(),
            rusty_s3::UrlStyle::Path,
            "bucket",
            "us-east-1",
        )
        .unwrap();
        let client = Client::new(bucket, None, 3, Duration::from_secs(1), Duration::ZERO);
        for attempt in 0..4 {
            let base = RETRY_DELAY_FIRST * (1 << attempt);
            let delays: Vec<Duration> = (0..50).map(|_| client.backoff(attempt)).collect();
            assert!(delays.iter().all(|d| base / 2 <= *d && *d < base * 3 / 2), "{delays:?}");
            assert!(delays.iter().any(|d| *d != delays[0]), "no jitter: {delays:?}");
        }
    }
}
