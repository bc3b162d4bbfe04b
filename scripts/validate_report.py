#!/usr/bin/env python3
"""Independent checks of kvasir-equiv's audit outputs and schema files.

The C++ side validates reports and protocols with its own small JSON-Schema
validator (lib/kvasir/core/json_schema.hpp). This script checks the same
documents with the reference Python implementation (`jsonschema`), so a bug
in either validator — or a schema that is not valid JSON Schema at all — shows
up as a disagreement. It is used by tests/steps/test_writers.cpp and can be
run by hand; it is not a runtime dependency of the tool.

  validate_report.py [--schema SCHEMA] FILE...
      Validate JSON files against SCHEMA (default protocols/report.schema.json).
  validate_report.py --check-schemas
      Check protocols/*.schema.json against the Draft 2020-12 meta-schema and
      validate every shipped protocol (protocols/*.json) against
      protocols/protocol.schema.json.
  validate_report.py --junit FILE
      Parse a JUnit XML file with xml.etree (a real XML parser), check the
      <testsuites>/<testsuite> counters against the testcases they hold, and
      print "tests=N failures=F errors=E skipped=S".

Exit codes: 0 valid, 1 invalid, 2 usage, 77 the jsonschema package is not
installed (callers report that as a skip, never as a pass).
"""

import argparse
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTOCOLS = os.path.join(ROOT, "protocols")


def load_validator():
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        print("validate_report.py: the Python package 'jsonschema' is not installed "
              "(pip install jsonschema); skipping", file=sys.stderr)
        sys.exit(77)
    return jsonschema.Draft202012Validator


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def validate_files(schema_path, files):
    validator_cls = load_validator()
    schema = load_json(schema_path)
    validator_cls.check_schema(schema)
    # The schemas' $id is relative ("kvasir-equiv/audit/1"): jsonschema's
    # resolver joins "#/$defs/..." onto it as a path (…/audit/kvasir-equiv/
    # audit/1) and fails. Resolved here against an absolute base that names
    # nothing on any network; the schema itself is unchanged.
    if isinstance(schema.get("$id"), str) and ":" not in schema["$id"]:
        schema = dict(schema, **{"$id": "urn:kvasir-equiv:" + schema["$id"].replace("/", ":")})
    validator = validator_cls(schema)
    bad = 0
    for path in files:
        errors = sorted(validator.iter_errors(load_json(path)), key=lambda e: list(e.absolute_path))
        for e in errors:
            pointer = "/" + "/".join(str(p) for p in e.absolute_path)
            print(f"{path}: {pointer}: {e.message}", file=sys.stderr)
        bad += bool(errors)
        if not errors:
            print(f"{path}: valid against {os.path.relpath(schema_path, ROOT)}")
    return 1 if bad else 0


def check_schemas():
    validator_cls = load_validator()
    for path in sorted(glob.glob(os.path.join(PROTOCOLS, "*.schema.json"))):
        validator_cls.check_schema(load_json(path))
        print(f"{os.path.relpath(path, ROOT)}: a valid Draft 2020-12 schema")
    protocols = [p for p in sorted(glob.glob(os.path.join(PROTOCOLS, "*.json"))) if not p.endswith(".schema.json")]
    if not protocols:
        print("no protocol files found", file=sys.stderr)
        return 1
    return validate_files(os.path.join(PROTOCOLS, "protocol.schema.json"), protocols)


def check_junit(path):
    root = ET.parse(path).getroot()
    if root.tag != "testsuites":
        print(f"{path}: root element is <{root.tag}>, expected <testsuites>", file=sys.stderr)
        return 1
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    ok = True
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(1 for c in cases if c.find("skipped") is not None),
        }
        for key, n in counts.items():
            totals[key] += n
            if int(suite.get(key, "-1")) != n:
                print(f"{path}: testsuite {suite.get('name')!r}: {key}={suite.get(key)} but holds {n}", file=sys.stderr)
                ok = False
        for c in cases:
            if not c.get("name") or not c.get("classname"):
                print(f"{path}: a testcase without name/classname in {suite.get('name')!r}", file=sys.stderr)
                ok = False
    for key, n in totals.items():
        if int(root.get(key, "-1")) != n:
            print(f"{path}: testsuites {key}={root.get(key)} but the suites hold {n}", file=sys.stderr)
            ok = False
    print("tests={tests} failures={failures} errors={errors} skipped={skipped}".format(**totals))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schema", default=os.path.join(PROTOCOLS, "report.schema.json"))
    ap.add_argument("--check-schemas", action="store_true")
    ap.add_argument("--junit", metavar="FILE")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if args.junit:
        return check_junit(args.junit)
    if args.check_schemas:
        return check_schemas()
    if not args.files:
        ap.print_usage(sys.stderr)
        return 2
    return validate_files(args.schema, args.files)


if __name__ == "__main__":
    sys.exit(main())
