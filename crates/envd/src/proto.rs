//! The envd protobuf messages, written by hand from the `.proto` shapes in e2b-protocol.md §3.3–§3.4.
//!
//! Each message derives `prost::Message` (binary protobuf, `application/proto`) and serde (ProtoJSON,
//! `application/json`) from one definition, so no `protoc` and no build script are needed: 17 methods
//! over ~40 small messages are cheaper to write once than a code generator is to build. Field names are
//! lowerCamelCase with snake_case aliases, defaults are omitted, oneofs are flattened into their parent
//! object (ProtoJSON), see [`crate::pjson`] for bytes, int64, enums and timestamps.

#![allow(missing_docs)] // The fields mirror the .proto files; their meaning is in e2b-protocol.md.

use crate::pjson::{self, ProtoEnum, is_false, is_zero};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

macro_rules! proto_enum {
    ($name:ident { $($variant:ident = $num:literal => $json:literal),* $(,)? }) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum $name { $($variant = $num),* }
        impl ProtoEnum for $name {
            fn name_of(v: i32) -> Option<&'static str> {
                match v { $($num => Some($json),)* _ => None }
            }
            fn number_of(name: &str) -> Option<i32> {
                match name { $($json => Some($num),)* _ => None }
            }
        }
    };
}

/// `google.protobuf.Timestamp`: RFC 3339 in JSON.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&pjson::rfc3339(self.seconds, self.nanos))
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let (seconds, nanos) = pjson::parse_rfc3339(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid timestamp {s:?}")))?;
        Ok(Self { seconds, nanos })
    }
}

/// An empty message (`StartEvent {}`, `KeepAlive {}`, `…Response {}`).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
pub struct Empty {}

// ---------------------------------------------------------------------------------------------
// process.Process
// ---------------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pty {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PtySize {
    #[prost(uint32, tag = "1")]
    #[serde(skip_serializing_if = "is_zero")]
    pub cols: u32,
    #[prost(uint32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    pub rows: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[prost(map = "string, string", tag = "3")]
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub envs: HashMap<String, String>,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListRequest {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessInfo {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    #[prost(uint32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    pub pid: u32,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[prost(bool, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UpdateRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessEvent {
    #[prost(oneof = "process_event::Event", tags = "1, 2, 3, 4")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<process_event::Event>,
}

/// Nested types of [`ProcessEvent`].
pub mod process_event {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(StartEvent),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        End(EndEvent),
        #[prost(message, tag = "4")]
        Keepalive(Empty),
    }

    #[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct StartEvent {
        #[prost(uint32, tag = "1")]
        #[serde(skip_serializing_if = "is_zero")]
        pub pid: u32,
    }

    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct DataEvent {
        #[prost(oneof = "data_event::Output", tags = "1, 2, 3")]
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        pub output: Option<data_event::Output>,
    }

    /// Nested types of [`DataEvent`].
    pub mod data_event {
        use super::*;

        #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub enum Output {
            #[prost(bytes = "vec", tag = "1")]
            Stdout(#[serde(with = "pjson::b64")] Vec<u8>),
            #[prost(bytes = "vec", tag = "2")]
            Stderr(#[serde(with = "pjson::b64")] Vec<u8>),
            #[prost(bytes = "vec", tag = "3")]
            Pty(#[serde(with = "pjson::b64")] Vec<u8>),
        }
    }

    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct EndEvent {
        #[prost(sint32, tag = "1")]
        #[serde(skip_serializing_if = "is_zero", alias = "exit_code")]
        pub exit_code: i32,
        #[prost(bool, tag = "2")]
        #[serde(skip_serializing_if = "is_false")]
        pub exited: bool,
        #[prost(string, tag = "3")]
        #[serde(skip_serializing_if = "String::is_empty")]
        pub status: String,
        #[prost(string, optional, tag = "4")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
    }
}

/// `StartResponse` and `ConnectResponse` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EventResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendInputRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessInput {
    #[prost(oneof = "process_input::Input", tags = "1, 2")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub input: Option<process_input::Input>,
}

/// Nested types of [`ProcessInput`].
pub mod process_input {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Input {
        #[prost(bytes = "vec", tag = "1")]
        Stdin(#[serde(with = "pjson::b64")] Vec<u8>),
        #[prost(bytes = "vec", tag = "2")]
        Pty(#[serde(with = "pjson::b64")] Vec<u8>),
    }
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StreamInputRequest {
    #[prost(oneof = "stream_input_request::Event", tags = "1, 2, 3")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<stream_input_request::Event>,
}

/// Nested types of [`StreamInputRequest`].
pub mod stream_input_request {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(StartEvent),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        Keepalive(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct StartEvent {
        #[prost(message, optional, tag = "1")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
    }

    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct DataEvent {
        #[prost(message, optional, tag = "2")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub input: Option<ProcessInput>,
    }
}

proto_enum!(Signal {
    Unspecified = 0 => "SIGNAL_UNSPECIFIED",
    Sigterm = 15 => "SIGNAL_SIGTERM",
    Sigkill = 9 => "SIGNAL_SIGKILL",
});

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendSignalRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[prost(enumeration = "Signal", tag = "2")]
    #[serde(
        skip_serializing_if = "is_zero",
        serialize_with = "pjson::enum_i32::serialize::<Signal, _>",
        deserialize_with = "pjson::enum_i32::deserialize::<Signal, _>"
    )]
    pub signal: i32,
}

/// `ConnectRequest` and `CloseStdinRequest` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SelectorRequest {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessSelector {
    #[prost(oneof = "process_selector::Selector", tags = "1, 2")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub selector: Option<process_selector::Selector>,
}

/// Nested types of [`ProcessSelector`].
pub mod process_selector {
    use super::*;

    #[derive(Clone, PartialEq, Eq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Selector {
        #[prost(uint32, tag = "1")]
        Pid(u32),
        #[prost(string, tag = "2")]
        Tag(String),
    }
}

// ---------------------------------------------------------------------------------------------
// filesystem.Filesystem
// ---------------------------------------------------------------------------------------------

proto_enum!(FileType {
    Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
    File = 1 => "FILE_TYPE_FILE",
    Directory = 2 => "FILE_TYPE_DIRECTORY",
    Symlink = 3 => "FILE_TYPE_SYMLINK",
});

proto_enum!(EventType {
    Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
    Create = 1 => "EVENT_TYPE_CREATE",
    Write = 2 => "EVENT_TYPE_WRITE",
    Remove = 3 => "EVENT_TYPE_REMOVE",
    Rename = 4 => "EVENT_TYPE_RENAME",
    Chmod = 5 => "EVENT_TYPE_CHMOD",
});

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntryInfo {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[prost(enumeration = "FileType", tag = "2")]
    #[serde(
        rename = "type",
        skip_serializing_if = "is_zero",
        serialize_with = "pjson::enum_i32::serialize::<FileType, _>",
        deserialize_with = "pjson::enum_i32::deserialize::<FileType, _>"
    )]
    pub r#type: i32,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[prost(int64, tag = "4")]
    #[serde(skip_serializing_if = "is_zero", with = "pjson::i64_str")]
    pub size: i64,
    #[prost(uint32, tag = "5")]
    #[serde(skip_serializing_if = "is_zero")]
    pub mode: u32,
    #[prost(string, tag = "6")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    #[prost(string, tag = "7")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub owner: String,
    #[prost(string, tag = "8")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none", alias = "modified_time")]
    pub modified_time: Option<Timestamp>,
    #[prost(string, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none", alias = "symlink_target")]
    pub symlink_target: Option<String>,
    #[prost(map = "string, string", tag = "11")]
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub metadata: HashMap<String, String>,
    #[prost(bool, tag = "12")]
    #[serde(skip_serializing_if = "is_false", alias = "is_symlink")]
    pub is_symlink: bool,
}

/// `StatRequest`, `MakeDirRequest` and `RemoveRequest` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PathRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// `StatResponse`, `MakeDirResponse` and `MoveResponse` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntryResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MoveRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[prost(uint32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    pub depth: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirResponse {
    #[prost(message, repeated, tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[prost(bool, tag = "2")]
    #[serde(skip_serializing_if = "is_false")]
    pub recursive: bool,
    #[prost(bool, tag = "3")]
    #[serde(skip_serializing_if = "is_false", alias = "include_entry")]
    pub include_entry: bool,
    #[prost(bool, tag = "4")]
    #[serde(skip_serializing_if = "is_false", alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FilesystemEvent {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[prost(enumeration = "EventType", tag = "2")]
    #[serde(
        rename = "type",
        skip_serializing_if = "is_zero",
        serialize_with = "pjson::enum_i32::serialize::<EventType, _>",
        deserialize_with = "pjson::enum_i32::deserialize::<EventType, _>"
    )]
    pub r#type: i32,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchDirResponse {
    #[prost(oneof = "watch_dir_response::Event", tags = "1, 2, 3")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<watch_dir_response::Event>,
}

/// Nested types of [`WatchDirResponse`].
pub mod watch_dir_response {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(clippy::large_enum_variant)] // mirrors the proto; events are short-lived
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(Empty),
        #[prost(message, tag = "2")]
        Filesystem(FilesystemEvent),
        #[prost(message, tag = "3")]
        Keepalive(Empty),
    }
}

/// `CreateWatcherResponse`, `GetWatcherEventsRequest` and `RemoveWatcherRequest` share this shape.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatcherId {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty", alias = "watcher_id")]
    pub watcher_id: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GetWatcherEventsResponse {
    #[prost(message, repeated, tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::process_event::{DataEvent, EndEvent, Event, StartEvent, data_event::Output};
    use super::*;
    use prost::Message as _;

    fn ev(e: Event) -> EventResponse {
        EventResponse { event: Some(ProcessEvent { event: Some(e) }) }
    }

    #[test]
    fn json_matches_the_observed_wire() {
        let s = serde_json::to_string(&ev(Event::Start(StartEvent { pid: 4242 }))).unwrap();
        assert_eq!(s, r#"{"event":{"start":{"pid":4242}}}"#);
        let s = serde_json::to_string(&ev(Event::Data(DataEvent {
            output: Some(Output::Stdout(b"hi\n".to_vec())),
        })))
        .unwrap();
        assert_eq!(s, r#"{"event":{"data":{"stdout":"aGkK"}}}"#);
        let end = EndEvent { exited: true, status: "exit status 0".into(), ..Default::default() };
        let s = serde_json::to_string(&ev(Event::End(end))).unwrap();
        assert_eq!(s, r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#);
        let s = serde_json::to_string(&ev(Event::Keepalive(Empty {}))).unwrap();
        assert_eq!(s, r#"{"event":{"keepalive":{}}}"#);
    }

    #[test]
    fn json_decodes_sdk_requests() {
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"unknown":1}"#,
        )
        .unwrap();
        let p = r.process.unwrap();
        assert_eq!(p.args, ["-l", "-c", "echo hi"]);
        assert_eq!(p.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.stdin, Some(false));
        let r: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(r.signal, Signal::Sigkill as i32);
        assert_eq!(r.process.unwrap().selector, Some(process_selector::Selector::Pid(7)));
        let r: SendSignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(r.signal, 15);
        let r: StreamInputRequest =
            serde_json::from_str(r#"{"data":{"input":{"stdin":"eA=="}}}"#).unwrap();
        let Some(stream_input_request::Event::Data(d)) = r.event else { panic!("{r:?}") };
        assert_eq!(d.input.unwrap().input, Some(process_input::Input::Stdin(b"x".to_vec())));
        let r: WatchRequest = serde_json::from_str(
            r#"{"path":"/tmp","include_entry":true,"allowNetworkMounts":true}"#,
        )
        .unwrap();
        assert!(r.include_entry && r.allow_network_mounts);
        let r: WatcherId = serde_json::from_str("{\n  \"watcherId\": \"w1\"\n}").unwrap();
        assert_eq!(r.watcher_id, "w1");
    }

    #[test]
    fn entry_info_json_and_binary() {
        let e = EntryInfo {
            name: "a".into(),
            r#type: FileType::File as i32,
            path: "/tmp/a".into(),
            size: 5,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            modified_time: Some(Timestamp { seconds: 0, nanos: 0 }),
            ..Default::default()
        };
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(
            s,
            r#"{"name":"a","type":"FILE_TYPE_FILE","path":"/tmp/a","size":"5","mode":420,"permissions":"-rw-r--r--","modifiedTime":"1970-01-01T00:00:00Z"}"#
        );
        let back: EntryInfo = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e);
        let bin = e.encode_to_vec();
        assert_eq!(EntryInfo::decode(bin.as_slice()).unwrap(), e);
    }
}
