//! The Python client (`clients/python`, package `contextengine`) against a real `ce serve`:
//! its pytest suite (`clients/python/tests`: put, search in every mode, mv, rm, link and
//! related, status and the admin routes, every error family, sync and async) with two
//! tenant keys of two accounts and an admin key, and `mypy --strict` over the package and
//! its tests. The client's source is what runs (`PYTHONPATH=clients/python/src`); `.ci/run`
//! also installs it with `pip install ./clients/python`, which proves it installs.

use super::harness::{Ce, external, python, repo_root};

const KEY_A: &str = "py-client-key-account-a-01";
const KEY_B: &str = "py-client-key-account-b-01";
const KEY_ADMIN: &str = "py-client-key-the-admin-01";

/// Three keys: one per account (`pya`, `pyb`) and an admin key (the last two from the
/// environment, as a deployment would).
fn config() -> String {
    format!(
        "[[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"pya\"\n\
         [[server.api_keys]]\nkey_env = \"PY_CLIENT_KEY_B\"\naccount_id = \"pyb\"\n\
         [[server.api_keys]]\nkey_env = \"PY_CLIENT_KEY_ADMIN\"\nadmin = true\n"
    )
}

/// The environment of a Python run: the client's source first on the path, no bytecode or
/// pytest cache written into the repository, and no `CE_SERVER` / `CE_API_KEY` of the
/// caller's shell (the client reads them; empty means unset).
const PYTHON_ENV: &[(&str, &str)] = &[
    ("PYTHONPATH", "clients/python/src"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("CE_SERVER", ""),
    ("CE_API_KEY", ""),
];

#[test]
fn the_python_client_passes_its_suite_against_a_real_server() {
    let ce = Ce::hash(&config());
    let server = ce.serve_with_env(
        &[],
        &[
            ("PY_CLIENT_KEY_B", KEY_B),
            ("PY_CLIENT_KEY_ADMIN", KEY_ADMIN),
        ],
    );
    let mut env = PYTHON_ENV.to_vec();
    env.extend([
        ("CE_TEST_URL", server.url.as_str()),
        ("CE_TEST_KEY_A", KEY_A),
        ("CE_TEST_KEY_B", KEY_B),
        ("CE_TEST_KEY_ADMIN", KEY_ADMIN),
        ("CE_TEST_ACCOUNT_A", "pya"),
        ("CE_TEST_ACCOUNT_B", "pyb"),
    ]);
    let out = external(
        &python(),
        &[
            "-m",
            "pytest",
            "clients/python/tests",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
        ],
        &env,
    );
    assert!(out.contains(" passed"), "{out}");
    assert!(!out.contains("skipped"), "no test may skip: {out}");
}

#[test]
fn the_python_client_type_checks_strictly() {
    let out = external(
        &python(),
        &[
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            "/dev/null",
            "clients/python/src",
            "clients/python/tests",
        ],
        PYTHON_ENV,
    );
    assert!(out.contains("Success: no issues found"), "{out}");
}

/// The ```python block of the README's "Python client" section, as written.
fn readme_example() -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let section = readme
        .split_once("\n## Python client\n")
        .expect("README has a \"Python client\" section")
        .1;
    let block = section
        .split_once("```python\n")
        .expect("the section has a python block")
        .1;
    block
        .split_once("```")
        .expect("the block ends")
        .0
        .to_owned()
}

#[test]
fn the_readme_python_example_runs_as_written() {
    let ce = Ce::hash("");
    let server = ce.serve(&[]);
    let code = readme_example();
    let mut env = PYTHON_ENV.to_vec();
    env.retain(|(k, _)| *k != "CE_SERVER");
    env.push(("CE_SERVER", server.url.as_str()));
    let out = external(&python(), &["-c", &code], &env);
    for mode in ["vector", "keyword", "hybrid"] {
        assert!(
            out.contains(&format!("{mode} [('ctx://acme/docs/deploy'")),
            "{mode} did not find the node first: {out}"
        );
    }
    assert!(out.trim_end().ends_with("How we deploy."), "{out}");
}
