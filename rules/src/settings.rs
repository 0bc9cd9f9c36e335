//! Exports `dstl_proto::settings` through the WIT interface `settings`: the configuration
//! keys, their defaults, syntax and checks, for hosts that cannot link dstl-proto (the
//! Node host). Conversions only.

use std::time::Duration;

use dstl_proto::settings::{self, Setting, Value};
use dstl_proto::writer_request::WriterRequest;

use crate::component::exports::dstl::changelog::settings as wit;
use crate::component::{Component, from_wit_range};

fn to_wit(setting: Setting) -> wit::Setting {
    let value = match setting.value() {
        Value::Flag(b) => wit::SettingValue::Flag(b),
        Value::Bytes(n) => wit::SettingValue::Bytes(n),
        Value::Duration(d) => wit::SettingValue::Nanos(nanos(d)),
        Value::Count(n) => wit::SettingValue::Count(n),
        Value::Text(s) => wit::SettingValue::Text(s),
    };
    wit::Setting {
        key: setting.key().to_string(),
        value,
    }
}

/// Nanoseconds, saturating at 584 years (beyond any timeout a host can arm).
fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl wit::Guest for Component {
    fn parse(key: String, value: String) -> Result<wit::Setting, String> {
        settings::parse(&key, &value)
            .map(to_wit)
            .map_err(|e| e.to_string())
    }

    fn defaults() -> Vec<wit::Setting> {
        settings::defaults().into_iter().map(to_wit).collect()
    }

    fn check_batch_size(persist_size_threshold: u64, max_in_flight: u64) -> Result<(), String> {
        settings::check_batch_size(persist_size_threshold, max_in_flight).map_err(|e| e.to_string())
    }

    fn parse_memory(value: String) -> Option<u64> {
        settings::parse_memory(&value)
    }

    fn parse_duration(value: String) -> Option<u64> {
        settings::parse_duration(&value).map(nanos)
    }

    fn check_writer(request: wit::WriterRequest, storage_memory_limit: u64) -> Result<(), String> {
        WriterRequest {
            name: &request.name,
            key_group_range: from_wit_range(request.key_group_range),
            memory_limit: request.memory_limit,
            call_timeout: Duration::from_nanos(request.call_timeout_nanos),
        }
        .check(storage_memory_limit)
        .map_err(|e| e.to_string())
    }
}
