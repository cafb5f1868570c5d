//! A chat completions body rendered through a model's chat template the way
//! a local server renders it: Jinja with Python's string and dict methods
//! (`minijinja-contrib`'s pycompat, as Hugging Face's text-generation-inference
//! and vLLM's Rust front end do), blocks trimmed as in `transformers`, a
//! call's `arguments` parsed into an object (or left as text for the
//! templates that want text) and a missing `content` made `""` (as vLLM
//! and llama.cpp hand them to templates), `tojson` with
//! Python's `json.dumps` spacing and keywords, `raise_exception`,
//! `strftime_now`, `tools` `None` when none are offered and Python's
//! `is iterable`.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::value::{Kwargs, Value as Jinja};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};

/// One compiled template.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
}

/// Templates loop over the conversation a few times; a runaway loop is a
/// failure, not a hang.
const FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// Compiles `source`; the error is MiniJinja's, with its line.
    pub(crate) fn new(source: String) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|err| describe(&err))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        // Python's: `None` is not iterable (MiniJinja's own test says it is).
        env.add_test("iterable", |value: Jinja| !value.is_none() && value.try_iter().is_ok());
        // `{% generation %}` marks the assistant's tokens for training
        // masks; servers render its body as it is (transformers, vLLM).
        let mut source = source;
        for open in ["{%", "{%-"] {
            for close in ["%}", "-%}"] {
                source = source
                    .replace(
                        &format!("{open} generation {close}"),
                        &format!("{open} if true {close}"),
                    )
                    .replace(
                        &format!("{open} endgeneration {close}"),
                        &format!("{open} endif {close}"),
                    );
            }
        }
        env.add_template_owned("chat", source).map_err(|err| describe(&err))?;
        Ok(Self { env })
    }

    /// The prompt for `body` (`messages`, `tools`), with the generation
    /// prompt added as a server adds it; the error says what the template
    /// raised or where it broke.
    pub(crate) fn render(&self, body: &Value) -> Result<String, String> {
        // A call's arguments as an object, or — for the templates that add
        // them to a string, as llama.cpp finds out per template — as text.
        self.render_with(body, Arguments::Object)
            .or_else(|err| self.render_with(body, Arguments::Text).map_err(|_| err))
    }

    fn render_with(&self, body: &Value, arguments: Arguments) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|err| describe(&err))?;
        let messages: Vec<Value> = body["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .map(|message| template_message(message, arguments))
                    .collect()
            })
            .unwrap_or_default();
        let mut context = Map::new();
        context.insert("messages".into(), Value::Array(messages));
        // `None` when the request offers none, as transformers and vLLM pass it.
        context.insert("tools".into(), body.get("tools").cloned().unwrap_or(Value::Null));
        context.insert("add_generation_prompt".into(), Value::Bool(true));
        context.insert("bos_token".into(), Value::from("<s>"));
        context.insert("eos_token".into(), Value::from("</s>"));
        template.render(Serde(&context)).map_err(|err| describe(&err))
    }
}

/// How a call's `arguments` reach the template.
#[derive(Clone, Copy, PartialEq)]
enum Arguments {
    Object,
    Text,
}

/// A message as templates get it: no `null` content, a call's `arguments`
/// parsed unless the template wants them as text.
fn template_message(message: &Value, arguments: Arguments) -> Value {
    let mut message = message.clone();
    if message.get("content").is_none_or(Value::is_null) {
        message["content"] = Value::from("");
    }
    if arguments == Arguments::Text {
        return message;
    }
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            let arguments = &mut call["function"]["arguments"];
            if let Some(parsed) = arguments.as_str().and_then(|text| serde_json::from_str(text).ok()) {
                *arguments = parsed;
            }
        }
    }
    message
}

/// The error and its causes on one line (a template's own exception is the cause).
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn raise_exception(message: String) -> Result<Jinja, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {message}"),
    ))
}

/// A fixed moment (Friday 26 July 2024, 12:00:00), so the prompt does not
/// change with the date; the codes templates use.
fn strftime_now(format: String) -> String {
    [
        ("%d", "26"),
        ("%e", "26"),
        ("%a", "Fri"),
        ("%A", "Friday"),
        ("%b", "Jul"),
        ("%B", "July"),
        ("%m", "07"),
        ("%Y", "2024"),
        ("%y", "24"),
        ("%H", "12"),
        ("%I", "12"),
        ("%p", "PM"),
        ("%M", "00"),
        ("%S", "00"),
        ("%j", "208"),
    ]
    .iter()
    .fold(format, |text, (code, value)| text.replace(code, value))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`,
/// as `transformers` defines `tojson` for chat templates.
fn tojson(value: Jinja, kwargs: Kwargs) -> Result<Jinja, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let value = serde_json::to_value(&value).map_err(|err| Error::new(ErrorKind::BadSerialization, err.to_string()))?;
    let style = Style {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&value, 0, &mut out);
    Ok(Jinja::from_safe_string(out))
}

struct Style {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    fn write(&self, value: &Value, depth: usize, out: &mut String) {
        match value {
            Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    self.separate(index, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            Value::Object(map) if !map.is_empty() => {
                out.push('{');
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                for (index, (name, item)) in entries.into_iter().enumerate() {
                    self.separate(index, depth + 1, out);
                    self.string(name, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            Value::Array(_) => out.push_str("[]"),
            Value::Object(_) => out.push_str("{}"),
            Value::String(text) => self.string(text, out),
            other => out.push_str(&other.to_string()),
        }
    }

    fn separate(&self, index: usize, depth: usize, out: &mut String) {
        if index > 0 {
            out.push_str(&self.item);
        }
        if let Some(width) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(width) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    }

    fn string(&self, text: &str, out: &mut String) {
        let quoted = Value::from(text).to_string();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}
