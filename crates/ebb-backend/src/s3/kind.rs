//! The kinds of S3 request the client sends: their names in errors and logs, and the counter
//! each one is counted under.

/// The kinds of request, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    CheckBucket,
    HeadObject,
    GetObject,
    PutObject,
    DeleteObject,
    CopyObject,
    ListObjects,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    ListMultipartUploads,
}

impl Kind {
    pub(super) const ALL: [Kind; 13] = [
        Kind::CheckBucket,
        Kind::HeadObject,
        Kind::GetObject,
        Kind::PutObject,
        Kind::DeleteObject,
        Kind::CopyObject,
        Kind::ListObjects,
        Kind::CreateMultipartUpload,
        Kind::UploadPart,
        Kind::UploadPartCopy,
        Kind::CompleteMultipartUpload,
        Kind::AbortMultipartUpload,
        Kind::ListMultipartUploads,
    ];

    /// The S3 API name, used in error messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::CheckBucket => "ListObjectsV2 (bucket check)",
            Kind::HeadObject => "HeadObject",
            Kind::GetObject => "GetObject",
            Kind::PutObject => "PutObject",
            Kind::DeleteObject => "DeleteObject",
            Kind::CopyObject => "CopyObject",
            Kind::ListObjects => "ListObjectsV2",
            Kind::CreateMultipartUpload => "CreateMultipartUpload",
            Kind::UploadPart => "UploadPart",
            Kind::UploadPartCopy => "UploadPartCopy",
            Kind::CompleteMultipartUpload => "CompleteMultipartUpload",
            Kind::AbortMultipartUpload => "AbortMultipartUpload",
            Kind::ListMultipartUploads => "ListMultipartUploads",
        }
    }

    /// The counter's name.
    pub(super) fn counter(self) -> &'static str {
        match self {
            Kind::CheckBucket => "check_bucket_requests",
            Kind::HeadObject => "head_object_requests",
            Kind::GetObject => "get_object_requests",
            Kind::PutObject => "put_object_requests",
            Kind::DeleteObject => "delete_object_requests",
            Kind::CopyObject => "copy_object_requests",
            Kind::ListObjects => "list_objects_requests",
            Kind::CreateMultipartUpload => "create_multipart_upload_requests",
            Kind::UploadPart => "upload_part_requests",
            Kind::UploadPartCopy => "upload_part_copy_requests",
            Kind::CompleteMultipartUpload => "complete_multipart_upload_requests",
            Kind::AbortMultipartUpload => "abort_multipart_upload_requests",
            Kind::ListMultipartUploads => "list_multipart_uploads_requests",
        }
    }
}
