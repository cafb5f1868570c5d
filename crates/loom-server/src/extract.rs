//! axum's `Path` and `Query` extractors with the protocol's refusals: a
//! path segment or a query string that cannot be read (a percent escape
//! that is not UTF-8, say) answers `400 INVALID_PARAMS` with the JSON error
//! every other refusal has, not axum's plain-text one.

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Code};

/// [`Path`], refused as the protocol refuses.
pub(crate) struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(refused) => Err(ApiError::new(
                Code::InvalidParams,
                format!("the path cannot be read: {}", refused.body_text()),
            )),
        }
    }
}

/// [`Query`], refused as the protocol refuses.
pub(crate) struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Query::try_from_uri(&parts.uri)
            .map(|Query(value)| Self(value))
            .map_err(|refused| {
                ApiError::new(
                    Code::InvalidParams,
                    format!("the query string cannot be read: {}", refused.body_text()),
                )
            })
    }
}
