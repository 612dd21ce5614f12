//! Streams a chat answer: `cargo run --release -p tempo9 --example chat -- MODEL "question"`.
//! MODEL is a GGUF path or an Ollama model name.

use serde_json::json;
use tempo9::{ChatOptions, Event, LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(source), Some(question)) = (args.next(), args.next()) else {
        eprintln!("usage: chat MODEL QUESTION");
        std::process::exit(2);
    };
    let model = Model::load(&source, &LoadOptions::default())?;
    let messages = [json!({"role": "user", "content": question})];
    for event in model.chat(&messages, &[], &ChatOptions::greedy(256))? {
        match event {
            Event::Text(t) => print!("{t}"),
            Event::Reasoning(t) => eprint!("{t}"),
            Event::Done { usage, stop, .. } => eprintln!(
                "\n[{} prompt tokens ({} cached), {} generated; {}]",
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
                tempo9::chat::stop_name(&stop)
            ),
            _ => {}
        }
    }
    Ok(())
}
