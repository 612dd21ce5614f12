//! The Responses API's tool kinds, mapped onto the chat tools a template renders
//! and back: plain `function` tools, free-form `custom` tools (their input is text,
//! not JSON: Codex's `exec` and `apply_patch`) and `namespace` groups of either
//! (where Codex puts its own tools, inside an `additional_tools` input item for
//! its default models). Built-in tools (`web_search`, `tool_search`, ...) cannot run
//! here and are not offered.
//!
//! The model sees one flat list: a tool of the default namespace (`functions`) or
//! of none under its own name, any other as `<namespace>__<name>`. A call comes
//! back as the item its declaration asks for: `function_call` (with `namespace`
//! outside the default one) or `custom_tool_call` with the text input.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::tools::ToolCall;

use super::F;

/// The namespace a client's top-level tools live in (Codex's `functions`): its
/// tools are offered and called by their plain names.
const DEFAULT_NAMESPACE: &str = "functions";

/// How a declared tool is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// JSON arguments: a `function_call` item.
    Function,
    /// Free-form text input: a `custom_tool_call` item.
    Custom,
}

/// One tool the model was offered, under its flat name.
#[derive(Debug, Clone)]
struct Offered {
    kind: Kind,
    /// The namespace outside the default one, as the client must be told.
    namespace: Option<String>,
    /// The tool's own name within its namespace.
    name: String,
}

/// Every tool of a request: the chat tools to render, and how to turn the model's
/// calls of them back into Responses output items.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Chat-completions tools (`{type: function, function: {...}}`), in order.
    pub chat_tools: Vec<Value>,
    offered: HashMap<String, Offered>,
}

/// The name the model sees for `name` in `namespace`.
pub fn flat_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        None | Some("") | Some(DEFAULT_NAMESPACE) => name.to_string(),
        Some(ns) => format!("{ns}__{name}"),
    }
}

impl Catalog {
    /// The tools of `tools` and of every `additional_tools` input item.
    pub fn of_request(v: &Value) -> Result<Catalog, ApiError> {
        let mut c = Catalog::default();
        let items = v["input"].as_array().into_iter().flatten();
        let extra = items.filter(|it| it["type"] == "additional_tools");
        let all = v["tools"]
            .as_array()
            .into_iter()
            .chain(extra.filter_map(|it| it["tools"].as_array()))
            .flatten();
        for t in all {
            c.add(t, None, "")?;
        }
        Ok(c)
    }

    fn add(&mut self, t: &Value, namespace: Option<&str>, ns_desc: &str) -> Result<(), ApiError> {
        // Deferred tools are only reachable through tool search, which is not run here.
        if t["defer_loading"] == true {
            return Ok(());
        }
        let kind = match t["type"].as_str() {
            Some("function") => Kind::Function,
            Some("custom") => Kind::Custom,
            Some("namespace") if namespace.is_none() => {
                let ns = t["name"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        ApiError::bad_param(F, "tools", "namespace tools need a name")
                    })?;
                let desc = t["description"].as_str().unwrap_or("");
                for inner in t["tools"].as_array().into_iter().flatten() {
                    self.add(inner, Some(ns), desc)?;
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        let name = t["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::bad_param(F, "tools", "function and custom tools need a name")
            })?;
        let flat = flat_name(namespace, name);
        let mut description = t["description"].as_str().unwrap_or("").to_string();
        if !ns_desc.is_empty() && flat != name {
            description = format!("{ns_desc}\n\n{description}");
        }
        let parameters = match kind {
            Kind::Function => t
                .get("parameters")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or(json!({"type": "object", "properties": {}})),
            Kind::Custom => {
                description.push_str(&custom_input_note(&t["format"]));
                json!({"type": "object", "properties": {"input": {"type": "string",
                    "description": "The tool's whole input, as plain text"}}, "required": ["input"]})
            }
        };
        let mut f = json!({"name": flat, "parameters": parameters});
        if !description.is_empty() {
            f["description"] = json!(description);
        }
        self.chat_tools
            .push(json!({"type": "function", "function": f}));
        let namespace = namespace
            .filter(|ns| !ns.is_empty() && *ns != DEFAULT_NAMESPACE)
            .map(str::to_string);
        self.offered.insert(
            flat,
            Offered {
                kind,
                namespace,
                name: name.to_string(),
            },
        );
        Ok(())
    }

    /// The Responses output item of the model's `call` (`status` `in_progress`
    /// leaves its arguments or input empty, as the stream's `added` event shows it).
    pub fn call_item(&self, id: &str, call_id: &str, call: &ToolCall, status: &str) -> Value {
        let done = status != "in_progress";
        match self.offered.get(&call.name) {
            Some(o) if o.kind == Kind::Custom => {
                let input = if done {
                    custom_input(&call.arguments)
                } else {
                    String::new()
                };
                json!({"id": id, "type": "custom_tool_call", "status": status, "call_id": call_id,
                       "name": o.name, "input": input})
            }
            o => {
                let mut item = json!({"id": id, "type": "function_call", "status": status,
                    "call_id": call_id, "name": o.map_or(call.name.as_str(), |o| o.name.as_str()),
                    "arguments": if done { call.arguments.as_str() } else { "" }});
                if let Some(ns) = o.and_then(|o| o.namespace.as_deref()) {
                    item["namespace"] = json!(ns);
                }
                item
            }
        }
    }

    /// Whether the model's `call` goes back as free-form input.
    pub fn is_custom(&self, call: &ToolCall) -> bool {
        self.offered
            .get(&call.name)
            .is_some_and(|o| o.kind == Kind::Custom)
    }
}

/// What a free-form tool's description gains: how to pass its input, and the
/// grammar it must follow when the client gave one.
fn custom_input_note(format: &Value) -> String {
    let mut note = String::from(
        "\n\nThis tool takes free-form text, not JSON: put its whole input in the string `input`.",
    );
    if format["type"] == "grammar" {
        if let Some(def) = format["definition"].as_str() {
            let syntax = format["syntax"].as_str().unwrap_or("lark");
            note.push_str(&format!(
                "\nThe input must match this {syntax} grammar:\n```\n{}\n```",
                def.trim()
            ));
        }
    }
    note
}

/// A free-form tool's text from the model's JSON arguments: `input` when they
/// are an object holding it, a bare JSON string as such, else the text unchanged.
pub fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(o)) => match o.get("input") {
            Some(Value::String(s)) => s.clone(),
            _ => arguments.to_string(),
        },
        Ok(Value::String(s)) => s,
        _ => arguments.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codex_request() -> Value {
        json!({"input": [
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "namespace", "name": "functions", "description": "", "tools": [
                    {"type": "custom", "name": "exec", "description": "Run JavaScript.",
                     "format": {"type": "grammar", "syntax": "lark", "definition": "start: SOURCE\nSOURCE: /[\\s\\S]+/"}},
                    {"type": "function", "name": "wait", "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}}}}]},
                {"type": "namespace", "name": "clock", "description": "Time tools.", "tools": [
                    {"type": "function", "name": "sleep", "description": "Sleep."}]},
                {"type": "web_search"},
                {"type": "function", "name": "later", "defer_loading": true}]},
            {"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "name": "f"}]})
    }

    #[test]
    fn codex_tools_are_offered_flat() {
        let c = Catalog::of_request(&codex_request()).unwrap();
        let names: Vec<&str> = c
            .chat_tools
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["f", "exec", "wait", "clock__sleep"]);
        let exec = &c.chat_tools[1]["function"];
        assert_eq!(exec["parameters"]["required"], json!(["input"]));
        let d = exec["description"].as_str().unwrap();
        assert!(d.starts_with("Run JavaScript."), "{d}");
        assert!(
            d.contains("lark grammar") && d.contains("SOURCE: /[\\s\\S]+/"),
            "{d}"
        );
        let sleep = c.chat_tools[3]["function"]["description"].as_str().unwrap();
        assert_eq!(sleep, "Time tools.\n\nSleep.");
    }

    #[test]
    fn calls_come_back_as_declared() {
        let c = Catalog::of_request(&codex_request()).unwrap();
        let exec = ToolCall {
            name: "exec".into(),
            arguments: r#"{"input":"await tools.exec_command({cmd: \"ls\"})"}"#.into(),
        };
        assert!(c.is_custom(&exec));
        let item = c.call_item("ctc_1", "call_1", &exec, "completed");
        assert_eq!(
            item,
            json!({"id": "ctc_1", "type": "custom_tool_call", "status": "completed",
                   "call_id": "call_1", "name": "exec",
                   "input": "await tools.exec_command({cmd: \"ls\"})"})
        );
        let sleep = ToolCall {
            name: "clock__sleep".into(),
            arguments: r#"{"ms":5}"#.into(),
        };
        let item = c.call_item("fc_1", "call_2", &sleep, "completed");
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["name"], "sleep");
        assert_eq!(item["namespace"], "clock");
        let wait = ToolCall {
            name: "wait".into(),
            arguments: "{}".into(),
        };
        let item = c.call_item("fc_2", "call_3", &wait, "in_progress");
        assert_eq!(item["name"], "wait");
        assert_eq!(item["arguments"], "");
        assert!(item.get("namespace").is_none());
    }

    #[test]
    fn custom_input_forms() {
        assert_eq!(custom_input(r#"{"input":"a\nb"}"#), "a\nb");
        assert_eq!(custom_input(r#""raw""#), "raw");
        assert_eq!(custom_input("not json"), "not json");
        assert_eq!(custom_input(r#"{"code":"x"}"#), r#"{"code":"x"}"#);
    }
}
