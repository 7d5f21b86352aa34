//! What a worker costs when starlark-rust runs from Rust instead of under CPython, for
//! bench_docker_worker_floor --rust. A measurement, never deployed: no confinement, no limits, no
//! native calls, no diagnostics.
//!
//! At its start it does the work the Python worker's warm-up does: the standard globals, the
//! helper globals (struct and json), the helper module `<builtins>` evaluated and frozen (the
//! worker's own source, from env.star, which the benchmark writes; the Python callables it uses
//! are Starlark stubs there, where a Rust worker would register native functions) and a
//! throwaway program. Then it speaks as much of the protocol as a trivial execute needs: each
//! frame before the exec (4-byte big-endian length, then JSON) gets probe_ack; the exec's program
//! runs through the helper module's run_main, its value goes back as final; then it exits.

use std::io::{Read, Write};

use serde_json::{json, Value as Json};
use starlark::environment::{FrozenModule, Globals, GlobalsBuilder, LibraryExtension, Module};
use starlark::eval::Evaluator;
use starlark::syntax::{AstModule, Dialect};

const HELPERS: &str = include_str!("../env.star");
const DRIVER: &str = "result = run_main(main, 100, 100000)\n";

fn read_frame(input: &mut impl Read) -> Option<Json> {
    let mut head = [0u8; 4];
    input.read_exact(&mut head).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
    input.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

fn send(output: &mut impl Write, frame: &Json) {
    let body = serde_json::to_vec(frame).expect("a JSON value encodes");
    let sent = output
        .write_all(&(body.len() as u32).to_be_bytes())
        .and_then(|()| output.write_all(&body))
        .and_then(|()| output.flush());
    if sent.is_err() {
        std::process::exit(1);
    }
}

fn helpers(globals: &Globals) -> FrozenModule {
    let ast = AstModule::parse("<builtins>", HELPERS.to_owned(), &Dialect::Standard).expect("env.star parses");
    Module::with_temp_heap(|module| {
        Evaluator::new(&module).eval_module(ast, globals).expect("env.star evaluates");
        module.freeze().expect("the helper module freezes")
    })
}

fn failed(error: &str, message: impl ToString) -> Json {
    json!({"k": "final_error", "error": error, "message": message.to_string()})
}

/// Runs `source`'s main() through the helper module's run_main: ["ok", json text] on success.
fn run(source: &str, globals: &Globals, helpers: &FrozenModule) -> Json {
    Module::with_temp_heap(|module| {
        module.import_public_symbols(helpers);
        let mut eval = Evaluator::new(&module);
        let program = match AstModule::parse("<codemode>", source.to_owned(), &Dialect::Standard) {
            Ok(ast) => ast,
            Err(e) => return failed("invalid_program", e),
        };
        let driver = AstModule::parse("<driver>", DRIVER.to_owned(), &Dialect::Standard).expect("the driver parses");
        if let Err(e) = eval.eval_module(program, globals).and_then(|_| eval.eval_module(driver, globals)) {
            return failed("runtime", e);
        }
        let outcome: Json = match module.get("result").map(|r| r.to_json()) {
            Some(Ok(text)) => serde_json::from_str(&text).unwrap_or(Json::Null),
            _ => return failed("internal", ""),
        };
        match outcome[1].as_str().map(serde_json::from_str::<Json>) {
            Some(Ok(value)) if outcome[0] == "ok" => json!({"k": "final", "value": value}),
            _ => failed("internal", ""),
        }
    })
}

fn main() {
    let globals = Globals::standard();
    let helper_globals = GlobalsBuilder::extended_by(&[LibraryExtension::StructType, LibraryExtension::Json]).build();
    let helpers = helpers(&helper_globals);
    run("def main():\n    return [i * 2 for i in range(10)]\n", &globals, &helpers); // the warm-up
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    while let Some(frame) = read_frame(&mut input) {
        if frame["k"] == "exec" {
            let reply = run(frame["source"].as_str().unwrap_or(""), &globals, &helpers);
            send(&mut output, &reply);
            std::process::exit(0);
        }
        send(&mut output, &json!({"k": "probe_ack", "v": 1}));
    }
}
