//! The language, table by table: expressions and their values, errors and their wording, parse
//! errors and their positions, and properties no input may break (no panic, a bounded
//! evaluation).

use serde_json::json;

use super::*;

/// Evaluates `source` with `self` bound to `data`.
fn run(source: &str, data: &serde_json::Value) -> Result<Value, String> {
    let program = Program::compile(source).map_err(|e| format!("parse: {e}"))?;
    program.evaluate(&[("self", Value::from_json(data))]).map_err(|e| e.to_string())
}

fn data() -> serde_json::Value {
    json!({
        "minReplicas": 1,
        "maxReplicas": 5,
        "name": "web-01",
        "tags": ["a", "b", "c"],
        "numbers": [3, 1, 2],
        "probes": [{"name": "alive", "activity": {}}, {"name": "http", "httpGet": {"host": ""}}],
        "labels": {"app": "web", "tier": "front"},
        "timeout": "1h30m",
        "created": "2024-03-01T12:30:45Z",
        "dash-name": 7,
        "namespace": "ns",
        "ratio": 0.5,
    })
}

#[test]
fn expressions_evaluate_to_cel_values() {
    let data = data();
    let cases: &[(&str, serde_json::Value)] = &[
        // Literals.
        ("1 + 2 * 3", json!(7)),
        ("(1 + 2) * 3", json!(9)),
        ("-9223372036854775808", json!(i64::MIN)),
        ("0x1F", json!(31)),
        ("7u", json!(7)),
        ("1.5e1", json!(15.0)),
        (".5 + 1.0", json!(1.5)),
        ("'a\\n\\'b\\x41\\u00e9\\101'", json!("a\n'bAéA")),
        ("r'a\\nb'", json!("a\\nb")),
        ("'''multi\nline'''", json!("multi\nline")),
        ("\"double\" + 'single'", json!("doublesingle")),
        ("size(b'\\xff\\x00abc')", json!(5)),
        ("null == null", json!(true)),
        ("[1, 2, 3][1]", json!(2)),
        ("{'a': 1, 'b': 2}['b']", json!(2)),
        ("{1: 'one'}[1u]", json!("one")),
        // Arithmetic and comparison.
        ("7 / 2", json!(3)),
        ("-7 % 3", json!(-1)),
        ("7.0 / 2.0", json!(3.5)),
        ("10u - 3u", json!(7)),
        ("1 < 2 && 2 <= 2 && 3 > 2 && 3 >= 3", json!(true)),
        ("1 == 1.0 && 1u == 1 && 2 > 1.5", json!(true)),
        ("'abc' < 'abd'", json!(true)),
        ("[1, 2] == [1, 2] && {'a': 1} == {'a': 1}", json!(true)),
        ("[1, 'a'] != [1, 'b']", json!(true)),
        ("1 == 'a'", json!(false)),
        (
            "double('NaN') < 1.0 || double('NaN') >= 1 || double('NaN') == double('NaN')",
            json!(false),
        ),
        ("2 in [1, 2]", json!(true)),
        ("'app' in self.labels", json!(true)),
        ("[1] + [2]", json!([1, 2])),
        ("!true", json!(false)),
        ("!!true", json!(true)),
        ("--1", json!(1)),
        ("true ? 1 : 2", json!(1)),
        ("false ? 1 : true ? 2 : 3", json!(2)),
        // Error-absorbing logic.
        ("false && self.missing", json!(false)),
        ("self.missing && false", json!(false)),
        ("true || self.missing", json!(true)),
        ("self.missing || true", json!(true)),
        ("(1 / 0 > 1) || true", json!(true)),
        // Fields and has().
        ("self.minReplicas <= self.maxReplicas", json!(true)),
        ("has(self.name) && !has(self.missing)", json!(true)),
        ("has(self.probes[1].httpGet.host) && self.probes[1].httpGet.host != ''", json!(false)),
        ("self.dash__dash__name", json!(7)),
        ("self.__namespace__", json!("ns")),
        ("self.labels.app", json!("web")),
        // Macros.
        ("self.numbers.all(n, n > 0)", json!(true)),
        ("self.numbers.exists(n, n == 2)", json!(true)),
        ("self.numbers.exists_one(n, n > 1)", json!(false)),
        ("self.numbers.map(n, n * 2)", json!([6, 2, 4])),
        ("self.numbers.map(n, n > 1, n * 10)", json!([30, 20])),
        ("self.numbers.filter(n, n != 1)", json!([3, 2])),
        ("self.labels.all(k, k.size() >= 3)", json!(true)),
        ("self.tags.all(i, t, self.tags[i] == t)", json!(true)),
        ("self.labels.exists(k, v, k == 'tier' && v == 'front')", json!(true)),
        ("self.numbers.existsOne(i, n, i == n)", json!(false)),
        ("self.numbers.exists_one(i, n, i + 1 == n)", json!(false)),
        ("[5, 1, 7].exists_one(i, n, i == n)", json!(true)),
        ("self.tags.transformList(i, t, t + string(i))", json!(["a0", "b1", "c2"])),
        ("self.numbers.transformList(i, n, n > 1, i)", json!([0, 2])),
        ("self.labels.transformMap(k, v, v.upperAscii())", json!({"app": "WEB", "tier": "FRONT"})),
        ("self.labels.transformMap(k, v, k != 'app', v)", json!({"tier": "front"})),
        ("self.probes.exists(p, p.name == 'alive' && has(p.activity))", json!(true)),
        ("[0, -1].all(x, 1 / x > 0)", json!(false)),
        ("[0, 1].exists(x, 1 / x > 0)", json!(true)),
        (
            "(has(self.exec) ? 1 : 0) + (has(self.name) ? 1 : 0) + (has(self.tags) ? 1 : 0) == 2",
            json!(true),
        ),
        // Strings.
        ("size(self.name) == 6 && self.name.size() == 6", json!(true)),
        ("size('héllo')", json!(5)),
        ("self.name.startsWith('web') && self.name.endsWith('01')", json!(true)),
        ("self.name.contains('b-0')", json!(true)),
        ("self.name.matches('^[a-z]+-[0-9]+$')", json!(true)),
        ("matches('abc', 'b')", json!(true)),
        ("'abc'.matches('^' + 'a.c$') && self.tags.all(t, t.matches('^[a-c]$'))", json!(true)),
        ("'MiXeD'.lowerAscii() + 'MiXeD'.upperAscii()", json!("mixedMIXED")),
        ("'  x  '.trim()", json!("x")),
        ("'a,b,c'.split(',')", json!(["a", "b", "c"])),
        ("'a,b,c'.split(',', 2)", json!(["a", "b,c"])),
        ("['a', 'b'].join('-')", json!("a-b")),
        ("self.tags.join()", json!("abc")),
        ("'hello'.indexOf('l')", json!(2)),
        ("'hello'.indexOf('l', 3)", json!(3)),
        ("'hello'.lastIndexOf('l')", json!(3)),
        ("'hello'.indexOf('z')", json!(-1)),
        ("'aaa'.replace('a', 'b')", json!("bbb")),
        ("'aaa'.replace('a', 'b', 2)", json!("bba")),
        ("'hello'.substring(1, 3) + 'hello'.charAt(4)", json!("elo")),
        // Lists.
        ("[1, 2, 2].isSorted() && !self.numbers.isSorted()", json!(true)),
        ("self.numbers.sum()", json!(6)),
        ("[1.5, 2.5].sum()", json!(4.0)),
        ("self.numbers.min()", json!(1)),
        ("self.numbers.max()", json!(3)),
        ("self.tags.indexOf('b')", json!(1)),
        // Conversions.
        ("int('42') + int(3.9) + int(2u)", json!(47)),
        ("uint(5)", json!(5)),
        ("double(1) + double('0.5')", json!(1.5)),
        ("string(1) + string(true) + string(2u)", json!("1true2")),
        (
            "[1.5, 100000.0, 1000000.0, 0.0001, 0.00001, -2.5e20, 0.0].map(d, string(d))",
            json!(["1.5", "100000", "1e+06", "0.0001", "1e-05", "-2.5e+20", "0"]),
        ),
        ("bool('true')", json!(true)),
        // Durations and timestamps.
        ("duration(self.timeout) >= duration('1s')", json!(true)),
        ("duration('300ms') < duration('1s')", json!(true)),
        ("string(duration('1h30m'))", json!("5400s")),
        ("string(duration('1.5s'))", json!("1.5s")),
        ("duration(self.timeout).getMinutes()", json!(90)),
        ("duration('1m') + duration('30s') == duration('90s')", json!(true)),
        ("timestamp(self.created).getFullYear()", json!(2024)),
        ("timestamp(self.created).getMonth()", json!(2)),
        ("timestamp(self.created).getHours('+02:00')", json!(14)),
        ("timestamp(self.created) + duration('1h') > timestamp(self.created)", json!(true)),
        (
            "string(timestamp('2024-01-02T00:00:00Z') - timestamp('2024-01-01T00:00:00Z'))",
            json!("86400s"),
        ),
        ("string(timestamp(self.created) - duration('30m'))", json!("2024-03-01T12:00:45Z")),
        ("int(timestamp('1970-01-01T00:01:00Z'))", json!(60)),
        // Types.
        ("type(1) == int && type('a') == string && type(self.labels) == map", json!(true)),
        ("type(self.ratio) == double ? 'number' : 'other'", json!("number")),
        ("string(type([]))", json!("list")),
        // Optionals.
        ("self.?missing.orValue(5)", json!(5)),
        ("self.?labels.app.orValue('none')", json!("web")),
        ("self.?nope.app.orValue('none')", json!("none")),
        ("self.labels[?'tier'].hasValue()", json!(true)),
        ("self.tags[?7].hasValue()", json!(false)),
        ("optional.of(1).value() + optional.none().orValue(2)", json!(3)),
        ("optional.none().or(optional.of('x')).value()", json!("x")),
        ("optional.ofNonZeroValue('').hasValue()", json!(false)),
        // Quantities.
        ("quantity('1.5Gi').isGreaterThan(quantity('1500Mi'))", json!(true)),
        ("quantity('500m') == quantity('0.5') && quantity('1k') == quantity('1e3')", json!(true)),
        ("quantity('2').add(quantity('500m')).asApproximateFloat()", json!(2.5)),
        ("quantity('2Ki').sub(48).asInteger()", json!(2000)),
        ("quantity('1n').isInteger() || quantity('1.5').isInteger()", json!(false)),
        ("quantity('-1m').sign() + quantity('1').compareTo(quantity('2'))", json!(-2)),
        ("quantity('0.1n')", json!("0.000000001")),
        (
            "isQuantity('10Mi') && !isQuantity('10 Mi') && !isQuantity('Mi') && !isQuantity('1.2.3')",
            json!(true),
        ),
        // Sets and regular expressions.
        ("sets.contains([1, 2, 3], [2, 3]) && !sets.contains([1], [2])", json!(true)),
        ("sets.equivalent([1, 2], [2, 1, 1]) && sets.intersects([1], [3, 1])", json!(true)),
        ("'abc123def45'.find('[0-9]+')", json!("123")),
        ("'abc123def45'.findAll('[0-9]+')", json!(["123", "45"])),
        ("'abc'.reverse()", json!("cba")),
        ("[1, 2, 3].reverse()", json!([3, 2, 1])),
        ("[1, 2, 1, 3, 2].distinct()", json!([1, 2, 3])),
        ("[[1, [2]], [3]].flatten()", json!([1, [2], 3])),
        ("[[1, [2]], [3]].flatten(2)", json!([1, 2, 3])),
        ("[1, 2, 3, 4].slice(1, 3)", json!([2, 3])),
        ("[3, 1, 2].sort()", json!([1, 2, 3])),
        ("['b', 'a'].sort().first().value()", json!("a")),
        ("[].last().hasValue()", json!(false)),
        ("lists.range(3)", json!([0, 1, 2])),
    ];
    for (source, expected) in cases {
        let got = run(source, &data).map(|v| v.to_json());
        assert_eq!(got.as_ref(), Ok(expected), "{source}");
    }
}

#[test]
fn errors_are_typed_and_worded_as_cel_go() {
    let data = data();
    let cases = [
        ("self.missing", "no such key: missing"),
        ("self.labels['nope']", "no such key: nope"),
        ("self.tags[5]", "index '5' out of range in list size '3'"),
        ("1 / 0", "division by zero"),
        ("1 % 0", "modulus by zero"),
        ("9223372036854775807 + 1", "integer overflow"),
        ("-9223372036854775807 - 2", "integer overflow"),
        ("0u - 1u", "unsigned integer overflow"),
        ("1 + 1.0", "no such overload: _+_(int, double)"),
        ("1 < 'a'", "no such overload: _<_(int, string)"),
        ("'abc'.size(1)", "no such overload: size(string, int)"),
        ("nope", "undeclared reference to 'nope'"),
        ("duration('1d')", "time: missing unit in duration \"1d\""),
        ("duration('x')", "time: invalid duration \"x\""),
        ("int('x')", "cannot convert \"x\" to int"),
        ("[].min()", "min called on empty list"),
        (
            "timestamp(self.created).getHours('+99999999:00')",
            "unsupported time zone \"+99999999:00\"",
        ),
        ("self.name && true", "no such overload: _&&_(string, bool)"),
        ("true ? self.missing : 1", "no such key: missing"),
        ("[1, 2].exists_one(x, x / 0 == 1)", "division by zero"),
        ("optional.none().value()", "optional.none() dereference"),
        ("lists.range(1000000000)", "lists.range(1000000000) is longer than 1000000"),
        ("self.?labels.nope", "no such key: nope"),
        (
            "'a'.matches('(')",
            "invalid regular expression: regex parse error:\n    (\n    ^\nerror: unclosed group",
        ),
    ];
    for (source, expected) in cases {
        assert_eq!(run(source, &data), Err(expected.to_owned()), "{source}");
    }
}

#[test]
fn evaluation_stops_at_its_step_budget() {
    let program =
        Program::compile("lists.range(100).all(a, lists.range(100).all(b, true))").unwrap();
    assert_eq!(program.evaluate_within(&[], 1_000), Err(EvalError::CostLimitExceeded));
    assert_eq!(program.evaluate_within(&[], 100_000), Ok(Value::Bool(true)));
    assert_eq!(
        EvalError::CostLimitExceeded.to_string(),
        "operation cancelled: actual cost limit exceeded"
    );
}

#[test]
fn parse_errors_say_where() {
    let cases = [
        ("1 +", "1:4: unexpected end of input"),
        ("self.", "1:6: expected an identifier"),
        ("(1", "1:3: expected ')', found end of input"),
        ("a\n  && #", "2:6: unexpected character '#'"),
        ("'open", "1:1: unterminated string literal"),
        ("9223372036854775808", "1:1: integer literal out of range"),
        ("has(self)", "1:10: invalid argument to has() macro"),
        ("[1].all(1, true)", "1:17: argument to all must be a simple name"),
        ("[1].transformList(i, true)", "1:27: wrong number of arguments to macro transformList"),
        ("if", "1:1: reserved identifier: if"),
        ("1 2", "1:3: unexpected literal"),
    ];
    for (source, expected) in cases {
        let error = Program::compile(source).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(error, Err(expected.to_owned()), "{source}");
    }
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let source = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
    let chain = vec!["1"; 10_000].join(" + ");
    let negations = format!("{}true", "!".repeat(10_000));
    let selections = format!("self{}", ".a".repeat(10_000));
    for source in [source, chain, negations, selections] {
        let error = Program::compile(&source).map(|_| ()).map_err(|e| e.message);
        assert_eq!(error, Err("expression nested too deeply".to_owned()));
    }
}

#[test]
fn references_ignore_shadowing_comprehension_variables() {
    let transition = Program::compile("self == oldSelf").unwrap();
    assert!(transition.references("oldSelf"));
    let shadowed = Program::compile("self.all(oldSelf, oldSelf > 0)").unwrap();
    assert!(!shadowed.references("oldSelf"));
    let second = Program::compile("self.all(i, oldSelf, oldSelf > i)").unwrap();
    assert!(!second.references("oldSelf"));
}

proptest::proptest! {
    /// Whatever the text, compiling and evaluating it answers (a value or an error); it never
    /// panics, since an admission webhook evaluates rules on every write.
    #[test]
    fn arbitrary_text_never_panics(
        source in r#"([a-z0-9 .()\[\]{}:,?!<>=&|+*/%'"\\_-]|self|has|size|all|exists|map|filter|true|null|0x|1u|1e5|'''|r'|b'|\\x|\\u){0,40}"#
    ) {
        if let Ok(program) = Program::compile(&source) {
            let _ = program.evaluate(&[("self", Value::from_json(&data()))]);
        }
    }
}

proptest::proptest! {
    /// Any text is a quantity or an error, never a panic, and a quantity survives a round
    /// trip through its decimal form.
    #[test]
    fn quantities_parse_without_panicking(text in "[-+]?[0-9.]{0,30}(e[-+]?[0-9]{0,5}|[KMGTPE]i|[numkMGTPE])?") {
        if let Ok(nanos) = crate::quantity::parse(&text) {
            let again = crate::quantity::parse(&crate::quantity::format(nanos));
            proptest::prop_assert_eq!(again, Ok(nanos));
        }
    }
}

proptest::proptest! {
    /// Every function that reads a string argument (durations, timestamps, quantities, time
    /// zones, patterns, numbers) answers any text with a value or an error, never a panic.
    #[test]
    fn functions_read_any_text_without_panicking(
        template in proptest::sample::select(vec![
            "duration($)", "timestamp($)", "quantity($)", "isQuantity($)", "int($)", "uint($)",
            "double($)", "bool($)", "timestamp('2024-01-01T00:00:00Z').getHours($)",
            "'abc'.matches($)", "'abc'.findAll($)", "'a,b'.split($, 2)", "'abc'.indexOf($, 1)",
            "'abc'.replace($, 'x', 1)", "string(duration($))", "string(timestamp($))",
        ]),
        text in r"[-+0-9a-zA-Z:.,()\[\]*?µ ]{0,16}",
    ) {
        let quoted = format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"));
        let source = template.replace('$', &quoted);
        let program = Program::compile(&source);
        proptest::prop_assert!(program.is_ok(), "{source}: {program:?}");
        if let Ok(program) = program {
            let _ = program.evaluate(&[]);
        }
    }
}
