//! A tool-call round trip: the model asks for the weather, the application
//! answers, the model replies.
//! `cargo run --release -p tempo9 --example tools -- qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`

use serde_json::json;
use tempo9::{ChatOptions, LoadOptions, Model, Stop};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(source) = std::env::args().nth(1) else {
        eprintln!("usage: tools MODEL");
        std::process::exit(2);
    };
    let model = Model::load(&source, &LoadOptions::default())?;
    let tools = [json!({"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})];
    let mut messages =
        vec![json!({"role": "user", "content": "What is the weather in Paris right now?"})];
    let first = model
        .chat(&messages, &tools, &ChatOptions::greedy(64))?
        .collect_blocking();
    if first.stop != Stop::ToolCalls {
        println!("no tool call: {}", first.text);
        return Ok(());
    }
    let call = &first.calls[0];
    println!("model calls {}({})", call.name, call.arguments);
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}]}));
    messages.push(
        json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 23 degrees Celsius."}),
    );
    messages.push(json!({"role": "user", "content": "Now tell me the answer in one sentence."}));
    let answer = model
        .chat(&messages, &tools, &ChatOptions::greedy(64))?
        .collect_blocking();
    println!("{}", answer.text);
    println!(
        "({} of {} prompt tokens from the prefix cache)",
        answer.usage.cached_tokens, answer.usage.prompt_tokens
    );
    Ok(())
}
