//! The error type of this crate.

/// Everything that can go wrong when interpreting API values.
///
/// The types themselves deserialize leniently where the reference does; these errors come from
/// the helpers that give a string field its meaning (durations, enum strings, probe handlers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// A Go duration string (`"1m"`, `"1h30m"`, `"-5s"`) could not be parsed.
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration {
        /// The string as given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A duration that must not be negative was negative.
    #[error("duration {input:?} must not be negative")]
    NegativeDuration {
        /// The string as given.
        input: String,
    },
    /// A string is not one of the values a closed enum allows.
    #[error("unknown {type_name} value {value:?}")]
    UnknownEnumValue {
        /// The Rust type the string was parsed into.
        type_name: &'static str,
        /// The string as given.
        value: String,
    },
    /// A probe does not set exactly one handler.
    #[error(
        "probe {name:?} must set exactly one of exec, httpGet, tcpSocket or activity (found {count})"
    )]
    ProbeHandler {
        /// The probe's name.
        name: String,
        /// How many handlers it sets.
        count: usize,
    },
    /// A generated CRD could not be rendered as YAML.
    #[error("rendering CRD {name} as YAML: {message}")]
    CrdRender {
        /// The CRD's `metadata.name`.
        name: String,
        /// The serializer's message.
        message: String,
    },
}
