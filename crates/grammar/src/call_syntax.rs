//! How one tool call's name and arguments are written, for the families whose
//! calls are not a single JSON object: GPT-OSS harmony (the name in the channel
//! header, the arguments a JSON object), Qwen3-Coder / Qwen3.5 XML (one
//! `<parameter=…>` element per argument) and Gemma 4 (its own notation).
//!
//! Each function returns Lark rules defining `body_<i>` for tool `i`; the caller
//! wraps bodies in the format's `open` / `close` markup.

use serde_json::Value;

use crate::grammar::with_guidance_options;
use crate::SchemaMode;

/// The syntax of one call between a format's `open` and `close` markup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallSyntax {
    /// One JSON object `{"<name_key>": "<tool>", "<arguments_key>": {…}}`
    /// (Hermes, Llama 3, Mistral).
    JsonObject,
    /// The tool's name, then `between`, then the arguments as a JSON object
    /// (harmony: `get_weather <|constrain|>json<|message|>{…}`).
    NameThenJson {
        /// Markup between the name and the arguments.
        between: String,
    },
    /// Qwen3-Coder / Qwen3.5 XML, as their chat templates write it:
    /// `<function=NAME>\n` then per argument `<parameter=P>\nVALUE\n</parameter>\n`,
    /// then `</function>`. A string argument is raw text; any other is JSON.
    QwenXml,
    /// Gemma 4: `call:NAME{key:VALUE,…}` with bare keys, strings between two
    /// `<|"|>` tokens, bare numbers / `true` / `false` / `null`, `{…}` and `[…]`.
    Gemma4,
}

/// Gemma 4's string delimiter (both ends).
pub const GEMMA4_QUOTE: &str = "<|\"|>";

/// `s` as a Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// The object schema's properties in order, each with whether it is required.
fn properties(schema: &Value) -> Vec<(&str, &Value, bool)> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .map(|(k, v)| (k.as_str(), v, required.contains(&k.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

/// The string values a property allows, when it is an enum of strings only.
fn string_enum(prop: &Value) -> Option<Vec<&str>> {
    let e = prop.get("enum")?.as_array()?;
    let s: Vec<&str> = e.iter().filter_map(Value::as_str).collect();
    (s.len() == e.len() && !s.is_empty()).then_some(s)
}

/// Whether a property is a plain string (written raw / quoted, not as JSON).
fn is_string(prop: &Value) -> bool {
    prop.get("type").and_then(Value::as_str) == Some("string")
}

/// `%json` of a property schema, with the options every schema gets.
fn json_rule(prop: &Value, mode: SchemaMode) -> String {
    let s = with_guidance_options(prop, mode, false);
    format!(
        "%json {}",
        serde_json::to_string(&s).expect("a JSON value serializes")
    )
}

/// Harmony: the name as text, `between` markup, the arguments by their schema.
pub fn name_then_json(i: usize, name: &str, between: &str, args: &str) -> String {
    format!(
        "body_{i}: {} {between} args_{i}\nargs_{i}: {args}\n",
        lit(name)
    )
}

/// Qwen XML: each property in schema order; required ones always, the others
/// optionally. Uses the free-text terminal `TEXT`.
pub fn qwen_xml(i: usize, name: &str, schema: &Value, mode: SchemaMode) -> String {
    let mut rules = String::new();
    let mut seq = Vec::new();
    for (j, (key, prop, required)) in properties(schema).into_iter().enumerate() {
        let close = lit("\n</parameter>\n");
        let value = if let Some(values) = string_enum(prop) {
            let alts: Vec<String> = values.iter().map(|v| lit(v)).collect();
            format!("({}) {close}", alts.join(" | "))
        } else if is_string(prop) {
            // Raw text up to the closing tag: a lazy lexeme ends at its first
            // occurrence, as the parser reads it.
            rules.push_str(&format!("pstr_{i}_{j}[lazy]: TEXT {close}\n"));
            format!("pstr_{i}_{j}")
        } else {
            format!("{} {close}", json_rule(prop, mode))
        };
        rules.push_str(&format!(
            "param_{i}_{j}: {} {value}\n",
            lit(&format!("<parameter={key}>\n"))
        ));
        seq.push(match required {
            true => format!("param_{i}_{j}"),
            false => format!("param_{i}_{j}?"),
        });
    }
    rules.push_str(&format!(
        "body_{i}: {} {} {}\n",
        lit(&format!("<function={name}>\n")),
        seq.join(" "),
        lit("</function>")
    ));
    rules
}

/// Rules every Gemma 4 body shares: `gstr` (a quoted string), `gval` (any value
/// in Gemma's notation). `quote` is the Lark of [`GEMMA4_QUOTE`]; `quote_is_token`
/// when it is a control token (free text then cannot contain it).
pub fn gemma4_common(quote: &str, quote_is_token: bool) -> String {
    let gstr = match quote_is_token {
        true => format!("gstr: {quote} TEXT {quote}\n"),
        // Text markup: the string ends at the first closing quote.
        false => format!("gstr: {quote} gstr_rest\ngstr_rest[lazy]: TEXT {quote}\n"),
    };
    format!(
        "{gstr}gval: gstr | GNUM | \"true\" | \"false\" | \"null\" | gobj | garr\n\
         gobj: \"{{\" \"}}\" | \"{{\" gkv (\",\" gkv)* \"}}\"\n\
         gkv: GKEY \":\" gval\n\
         garr: \"[\" \"]\" | \"[\" gval (\",\" gval)* \"]\"\n\
         GKEY: /[A-Za-z_][A-Za-z0-9_]*/\n\
         GNUM: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/\n\
         GINT: /-?(0|[1-9][0-9]*)/\n"
    )
}

/// Gemma 4: `call:NAME{…}` with the properties in schema order, required ones
/// always and the others optionally, comma-separated. Strings, string enums,
/// numbers, integers and booleans follow their schema; other values are any
/// value in Gemma's notation.
pub fn gemma4(i: usize, name: &str, schema: &Value, quote: &str) -> String {
    let mut rules = String::new();
    let props = properties(schema);
    for (j, (key, prop, _)) in props.iter().enumerate() {
        let ty = prop.get("type").and_then(Value::as_str);
        let value = if let Some(values) = string_enum(prop) {
            let alts: Vec<String> = values
                .iter()
                .map(|v| format!("{quote} {} {quote}", lit(v)))
                .collect();
            format!("({})", alts.join(" | "))
        } else {
            match ty {
                Some("string") => "gstr".to_string(),
                Some("integer") => "GINT".to_string(),
                Some("number") => "GNUM".to_string(),
                Some("boolean") => "(\"true\" | \"false\")".to_string(),
                _ => "gval".to_string(),
            }
        };
        rules.push_str(&format!(
            "item_{i}_{j}: {} {value}\n",
            lit(&format!("{key}:"))
        ));
    }
    // The items from `j` on, after nothing (`first_`) or after an item (`more_`):
    // a comma goes before every item but the first one written.
    let n = props.len();
    for j in (0..n).rev() {
        let required = props[j].2;
        let next = |p: &str| match j + 1 < n {
            true => format!(" {p}_{i}_{}", j + 1),
            false => String::new(),
        };
        let (more_next, first_next) = (next("more"), next("first"));
        let more = match required {
            true => format!("\",\" item_{i}_{j}{more_next}"),
            false => format!("(\",\" item_{i}_{j})?{more_next}"),
        };
        let first = match (required, first_next.is_empty()) {
            (true, _) => format!("item_{i}_{j}{more_next}"),
            (false, false) => format!("item_{i}_{j}{more_next} |{first_next}"),
            (false, true) => format!("item_{i}_{j} | \"\""),
        };
        rules.push_str(&format!("more_{i}_{j}: {more}\nfirst_{i}_{j}: {first}\n"));
    }
    let items = match n {
        0 => String::new(),
        _ => format!(" first_{i}_0"),
    };
    rules.push_str(&format!(
        "body_{i}: {}{items} \"}}\"\n",
        lit(&format!("call:{name}{{"))
    ));
    rules
}
