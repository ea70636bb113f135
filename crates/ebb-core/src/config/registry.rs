//! The knob registry: what every knob is (name, scope, unit, value kind and range, default,
//! doc), how a value is parsed, checked and applied.
//!
//! The knobs themselves are declared once, in `knobs.rs`, by the [`declare_knobs!`] macro, which also
//! writes the `Config` and `BackendConfig` structs. Everything else reads this registry: the
//! validation of ranges ([`Config::validate`]), setting by name ([`Config::set_knob`]), the
//! table in the `config` module doc (checked by a test), the simulator's experiment files, the
//! command line's `--knob` and per-knob flags, and the runtime's `Builder::knob`.

use std::fmt;

use super::size::{format_size, parse_size};
use super::{BackendConfig, Config, ConfigError};

/// Where a knob lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One value for the cache (`/proc/sys/vm`).
    Global,
    /// One value per backend (`/sys/class/bdi/<bdi>`, the block queue); set by name, it applies
    /// to every backend.
    Backend,
}

impl Scope {
    /// `global` or `backend`.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Backend => "backend",
        }
    }
}

/// What values a knob takes: the parser and the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A decimal integer in `min..=max`.
    Number {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// A size in bytes ([`parse_size`]) in `min..=max`.
    Bytes {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`.
    Bool,
    /// One of these names.
    Choice(&'static [&'static str]),
    /// Sizes separated by commas (`16MiB,4GiB`), at most `max_len` of them.
    Sizes {
        /// Most values accepted.
        max_len: usize,
    },
    /// One of these names, or a size in bytes ([`parse_size`]) in `min..=max`.
    ChoiceOrBytes {
        /// The names accepted besides a size.
        names: &'static [&'static str],
        /// Smallest accepted size.
        min: u64,
        /// Largest accepted size.
        max: u64,
    },
}

impl Kind {
    /// The range as people read it: `1..=10000`, `4MiB..=8TiB`, `legacy, ioless`.
    pub fn range_text(&self) -> String {
        let bound = |value: u64, bytes: bool| {
            if bytes { format_size(value) } else { value.to_string() }
        };
        let range = |min: u64, max: u64, bytes: bool, type_max: bool| match (min, type_max) {
            (_, true) => format!("{}..", bound(min, bytes)),
            _ => format!("{}..={}", bound(min, bytes), bound(max, bytes)),
        };
        match *self {
            Kind::Number { min, max } => {
                range(min, max, false, max == u64::from(u32::MAX) || max == u64::MAX)
            }
            Kind::Bytes { min, max } => range(min, max, true, max == u64::MAX),
            Kind::Bool => "0 or 1".to_owned(),
            Kind::Choice(names) => names.join(", "),
            Kind::Sizes { max_len } => format!("up to {max_len} sizes"),
            Kind::ChoiceOrBytes { names, min, max } => {
                format!("{} or {}", names.join(", "), range(min, max, true, max == u64::MAX))
            }
        }
    }
}

/// A knob's value, of the form its [`Kind`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A [`Kind::Number`] or [`Kind::Bytes`], or a size of a [`Kind::ChoiceOrBytes`].
    Number(u64),
    /// A [`Kind::Bool`].
    Bool(bool),
    /// A [`Kind::Choice`] (or a [`Kind::ChoiceOrBytes`]): one of its names.
    Choice(&'static str),
    /// A [`Kind::Sizes`].
    Sizes(Vec<u64>),
}

/// How the registry reads and writes a knob's field.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    Global { get: fn(&Config) -> Option<Value>, set: fn(&mut Config, &Value) },
    Backend { get: fn(&BackendConfig) -> Option<Value>, set: fn(&mut BackendConfig, &Value) },
}

/// One knob of the registry. All knobs: [`knobs`](fn@super::knobs); one by name:
/// [`knob`](fn@super::knob).
pub struct Knob {
    /// The kernel's name (`dirty_ratio`), or ebb's own for knobs the kernel lacks.
    pub name: &'static str,
    /// Global or per backend.
    pub scope: Scope,
    /// The unit, as shown in docs (`%`, `bytes`, `1/100 s`); empty for policies and flags.
    pub unit: &'static str,
    /// Parser and range.
    pub kind: Kind,
    /// The field's doc comment, one entry per line.
    pub doc_lines: &'static [&'static str],
    pub(crate) access: Access,
}

impl fmt::Debug for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Knob").field("name", &self.name).field("scope", &self.scope).finish()
    }
}

impl PartialEq for Knob {
    fn eq(&self, other: &Knob) -> bool {
        self.name == other.name
    }
}

impl Eq for Knob {}

impl Knob {
    /// The doc comment as one text (lines joined, paragraphs kept).
    pub fn doc(&self) -> String {
        let mut text = String::new();
        for line in self.doc_lines {
            let line = line.trim();
            if line.is_empty() {
                text.push_str("\n\n");
            } else {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push(' ');
                }
                text.push_str(line);
            }
        }
        text.trim().to_owned()
    }

    /// The doc's first paragraph: what the knob does, in a line.
    pub fn summary(&self) -> String {
        self.doc().split("\n\n").next().unwrap_or_default().to_owned()
    }

    /// The value a fresh [`Config`] (or [`BackendConfig`]) has; `None` when unset by default
    /// (the engine derives it, as the doc says).
    pub fn default_value(&self) -> Option<Value> {
        match self.access {
            Access::Global { get, .. } => get(&Config::defaults()),
            Access::Backend { get, .. } => get(&BackendConfig::defaults()),
        }
    }

    /// The value in `config`; for a backend knob, the first backend's.
    pub fn get(&self, config: &Config) -> Option<Value> {
        match self.access {
            Access::Global { get, .. } => get(config),
            Access::Backend { get, .. } => config.backends.first().and_then(get),
        }
    }

    /// The value in `backend`; `None` for a global knob.
    pub fn get_backend(&self, backend: &BackendConfig) -> Option<Value> {
        match self.access {
            Access::Global { .. } => None,
            Access::Backend { get, .. } => get(backend),
        }
    }

    /// Parses `text` into a setting of this knob, checking its form and range; the error names
    /// the knob and says what is accepted.
    pub fn parse(&'static self, text: &str) -> Result<Setting, ConfigError> {
        let text = text.trim();
        let fail = |reason: String| ConfigError::new(self.name, reason);
        let value = match self.kind {
            Kind::Number { .. } => Value::Number(text.parse().map_err(|_| {
                fail(format!("{text:?} is not a whole number ({})", self.kind.range_text()))
            })?),
            Kind::Bytes { .. } => Value::Number(parse_size(text).map_err(fail)?),
            Kind::Bool => Value::Bool(parse_bool(text).ok_or_else(|| {
                fail(format!("{text:?} is not a boolean (1/0, true/false, on/off, yes/no)"))
            })?),
            Kind::Choice(names) => Value::Choice(
                names.iter().copied().find(|name| *name == text).ok_or_else(|| {
                    fail(format!("unknown value {text:?}; expected one of {}", names.join(", ")))
                })?,
            ),
            Kind::ChoiceOrBytes { names, .. } => {
                match names.iter().copied().find(|n| *n == text) {
                    Some(name) => Value::Choice(name),
                    None => Value::Number(parse_size(text).map_err(|reason| {
                        fail(format!("{reason}; or one of {}", names.join(", ")))
                    })?),
                }
            }
            Kind::Sizes { .. } => Value::Sizes(
                text.split(',')
                    .filter(|part| !part.trim().is_empty())
                    .map(parse_size)
                    .collect::<Result<_, _>>()
                    .map_err(fail)?,
            ),
        };
        self.setting(value)
    }

    /// A setting of this knob to `value`, checked against its kind and range.
    pub fn setting(&'static self, value: Value) -> Result<Setting, ConfigError> {
        self.check(&value).map_err(|reason| ConfigError::new(self.name, reason))?;
        Ok(Setting { knob: self, value })
    }

    /// Why `value` is not one this knob takes, if it is not.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        let in_range = |n: u64, min: u64, max: u64| {
            if (min..=max).contains(&n) {
                Ok(())
            } else {
                Err(format!("{} is outside {}", self.render(value), self.kind.range_text()))
            }
        };
        match (self.kind, value) {
            (
                Kind::Number { min, max }
                | Kind::Bytes { min, max }
                | Kind::ChoiceOrBytes { min, max, .. },
                Value::Number(n),
            ) => in_range(*n, min, max),
            (Kind::Bool, Value::Bool(_)) => Ok(()),
            (Kind::Choice(names) | Kind::ChoiceOrBytes { names, .. }, Value::Choice(name))
                if names.contains(name) =>
            {
                Ok(())
            }
            (Kind::Sizes { max_len }, Value::Sizes(sizes)) if sizes.len() > max_len => {
                Err(format!("{} values exceed the limit of {max_len}", sizes.len()))
            }
            (Kind::Sizes { .. }, Value::Sizes(_)) => Ok(()),
            _ => Err(format!("{value:?} is not a value of kind {:?}", self.kind)),
        }
    }

    /// `value` as [`Knob::parse`] reads it back (sizes with a binary unit).
    pub fn render(&self, value: &Value) -> String {
        match (self.kind, value) {
            (Kind::Bytes { .. } | Kind::ChoiceOrBytes { .. }, Value::Number(n)) => format_size(*n),
            (_, Value::Number(n)) => n.to_string(),
            (_, Value::Bool(b)) => if *b { "1" } else { "0" }.to_owned(),
            (_, Value::Choice(name)) => (*name).to_owned(),
            (_, Value::Sizes(sizes)) => {
                sizes.iter().map(|&s| format_size(s)).collect::<Vec<_>>().join(",")
            }
        }
    }
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// A knob with a checked value, ready to apply: what `--knob name=value`, an experiment's
/// variant or `Builder::knob` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    knob: &'static Knob,
    value: Value,
}

impl Setting {
    /// The knob.
    pub fn knob(&self) -> &'static Knob {
        self.knob
    }

    /// The value.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Sets the value in `config`; a backend knob is set on every backend.
    pub fn apply(&self, config: &mut Config) {
        match self.knob.access {
            Access::Global { set, .. } => set(config, &self.value),
            Access::Backend { set, .. } => {
                config.backends.iter_mut().for_each(|backend| set(backend, &self.value));
            }
        }
    }

    /// Sets a backend knob's value in `backend`; a global knob is refused.
    pub fn apply_backend(&self, backend: &mut BackendConfig) -> Result<(), ConfigError> {
        match self.knob.access {
            Access::Backend { set, .. } => {
                set(backend, &self.value);
                Ok(())
            }
            Access::Global { .. } => Err(ConfigError::new(
                self.knob.name,
                "is a global knob, not a per-backend one".to_owned(),
            )),
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.knob.name, self.knob.render(&self.value))
    }
}

/// How a field's type holds a knob's [`Value`]; implemented for the types knobs use.
pub(crate) trait KnobField: Sized {
    /// The field's value, `None` when unset.
    fn to_value(&self) -> Option<Value>;
    /// The field's value from a checked [`Value`] of its knob.
    fn from_value(value: &Value) -> Self;
}

fn number(value: &Value) -> u64 {
    match value {
        Value::Number(n) => *n,
        other => panic!("a number knob got {other:?}; settings are checked against their kind"),
    }
}

impl KnobField for u64 {
    fn to_value(&self) -> Option<Value> {
        Some(Value::Number(*self))
    }
    fn from_value(value: &Value) -> u64 {
        number(value)
    }
}

impl KnobField for u32 {
    fn to_value(&self) -> Option<Value> {
        Some(Value::Number(u64::from(*self)))
    }
    fn from_value(value: &Value) -> u32 {
        u32::try_from(number(value)).expect("a u32 knob's range ends at u32::MAX at most")
    }
}

impl KnobField for Option<u64> {
    fn to_value(&self) -> Option<Value> {
        self.map(Value::Number)
    }
    fn from_value(value: &Value) -> Option<u64> {
        Some(number(value))
    }
}

impl KnobField for bool {
    fn to_value(&self) -> Option<Value> {
        Some(Value::Bool(*self))
    }
    fn from_value(value: &Value) -> bool {
        match value {
            Value::Bool(b) => *b,
            other => {
                panic!("a boolean knob got {other:?}; settings are checked against their kind")
            }
        }
    }
}

impl KnobField for Vec<u64> {
    fn to_value(&self) -> Option<Value> {
        Some(Value::Sizes(self.clone()))
    }
    fn from_value(value: &Value) -> Vec<u64> {
        match value {
            Value::Sizes(sizes) => sizes.clone(),
            other => panic!("a list knob got {other:?}; settings are checked against their kind"),
        }
    }
}

/// Declares the knobs: writes the `Config` and `BackendConfig` structs (knob fields with their
/// docs, then plain fields), their `defaults()`, and the registry's `KNOBS` table. Each knob is
/// `/// doc` then `name: Type = default, "unit", Kind;`.
macro_rules! declare_knobs {
    (
        $(#[$config_meta:meta])*
        pub struct Config {
            knobs {
                $( $(#[doc = $gdoc:literal])* $gname:ident : $gty:ty = $gdefault:expr,
                   $gunit:literal, $gkind:expr; )*
            }
            fields {
                $( $(#[doc = $gfdoc:literal])* $gfield:ident : $gfty:ty = $gfdefault:expr, )*
            }
        }
        $(#[$backend_meta:meta])*
        pub struct BackendConfig {
            knobs {
                $( $(#[doc = $bdoc:literal])* $bname:ident : $bty:ty = $bdefault:expr,
                   $bunit:literal, $bkind:expr; )*
            }
            fields {
                $( $(#[doc = $bfdoc:literal])* $bfield:ident : $bfty:ty = $bfdefault:expr, )*
            }
        }
    ) => {
        $(#[$config_meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            $( $(#[doc = $gdoc])* pub $gname: $gty, )*
            $( $(#[doc = $gfdoc])* pub $gfield: $gfty, )*
        }

        impl Config {
            /// Every field at its default (no backend).
            pub(crate) fn defaults() -> Config {
                Config { $( $gname: $gdefault, )* $( $gfield: $gfdefault, )* }
            }
        }

        $(#[$backend_meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct BackendConfig {
            $( $(#[doc = $bfdoc])* pub $bfield: $bfty, )*
            $( $(#[doc = $bdoc])* pub $bname: $bty, )*
        }

        impl BackendConfig {
            /// Every field at its default.
            pub(crate) fn defaults() -> BackendConfig {
                BackendConfig { $( $bfield: $bfdefault, )* $( $bname: $bdefault, )* }
            }
        }

        /// The registry, in declaration order: global knobs, then backend knobs.
        pub(crate) static KNOBS: &[Knob] = &[
            $( Knob {
                name: stringify!($gname),
                scope: Scope::Global,
                unit: $gunit,
                kind: $gkind,
                doc_lines: &[$($gdoc),*],
                access: Access::Global {
                    get: |config| KnobField::to_value(&config.$gname),
                    set: |config, value| config.$gname = KnobField::from_value(value),
                },
            }, )*
            $( Knob {
                name: stringify!($bname),
                scope: Scope::Backend,
                unit: $bunit,
                kind: $bkind,
                doc_lines: &[$($bdoc),*],
                access: Access::Backend {
                    get: |backend| KnobField::to_value(&backend.$bname),
                    set: |backend, value| backend.$bname = KnobField::from_value(value),
                },
            }, )*
        ];
    };
}

pub(crate) use declare_knobs;
