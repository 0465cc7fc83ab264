//! What counting a prompt with a route's tokenizer costs the gateway
//! (`--tokenizer`, src/gateway/tokenizer.rs): the request's JSON parsed, its
//! text found and encoded, for chat prompts of about 1,000, 8,000 and
//! 32,000 tokens. The tokenizer is a byte-level BPE of 16,000 tokens
//! trained here on generated English-like text (no download: a model's
//! own tokenizer.json is larger, and its cost per token is of the same
//! kind). `cargo bench --bench tokenizer`; figures in docs/performance.md.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lanekeeper::gateway::RouteTokenizer;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{PreTokenizerWrapper, Tokenizer};

const WORDS: [&str; 24] = [
    "the", "gateway", "admits", "requests", "of", "each", "lane", "within", "its", "rate", "and",
    "refuses", "what", "cannot", "meet", "deadline", "pool", "capacity", "tokens", "prompt",
    "answer", "model", "queue", "tenant",
];

/// `n` words of generated text (a small linear congruential walk over
/// the words, with punctuation), the same every run.
fn text(n: usize) -> String {
    let mut x: u64 = 42;
    let mut out = String::new();
    for i in 0..n {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        out.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        out.push_str(if i % 17 == 16 { ". " } else { " " });
    }
    out
}

fn trained() -> RouteTokenizer {
    let mut t = Tokenizer::new(BPE::default());
    t.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::default())));
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainerBuilder::new()
            .vocab_size(16_000)
            .show_progress(false)
            .build(),
    );
    let corpus: Vec<String> = (0..200).map(|i| text(200 + i)).collect();
    t.train(&mut trainer, corpus.iter()).expect("trains");
    let file = std::env::temp_dir().join(format!("lk-bench-tok-{}.json", std::process::id()));
    t.save(&file, false).expect("saves");
    let loaded = RouteTokenizer::load("bench", &file).expect("loads");
    std::fs::remove_file(&file).ok();
    loaded
}

fn chat(words: usize) -> Vec<u8> {
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": text(words)}
        ]
    })
    .to_string()
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let t = trained();
    let mut g = c.benchmark_group("count_prompt");
    for words in [1_000, 8_000, 32_000] {
        let body = chat(words);
        let tokens = t.count_body("/v1/chat/completions", &body).expect("counts");
        g.bench_function(format!("{tokens}_tokens_{}_bytes", body.len()), |b| {
            b.iter(|| t.count_body("/v1/chat/completions", black_box(&body)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
