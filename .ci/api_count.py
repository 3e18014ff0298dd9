#!/usr/bin/env python3
"""The public surface a user of the `hotlimit` crate meets, counted (issue #60's targets).

Reads rustdoc's JSON of the library (macros expanded: rustdoc sees the expanded crate), walks
every item reachable from the crate root by a public path (modules, re-exports, glob
re-exports), and counts:
  - pub fn: free functions, public inherent methods of reachable types, and the methods
    declared by reachable traits (a trait's implementations add none);
  - types: structs, enums, unions and type aliases;
  - traits.
Hidden items (`#[doc(hidden)]`) count too: they are callable all the same.

Usage: .ci/api_count.py [--check] [--ratchet] [--list] [--features F] [--json FILE]
  --check    exits 1 when a count is above its target (90 pub fn, 40 types, 12 traits)
  --ratchet  exits 1 when a count is above its ceiling, the figure the surface has been cut to
             (default features): it may shrink, never grow back. Lower a ceiling with each cut.
  --list     prints every counted item
"""
import argparse
import json
import os
import subprocess
import sys

TARGETS = {"pub fn": 90, "types": 40, "traits": 12}
CEILINGS = {"pub fn": 119, "types": 40, "traits": 12}


def load(features, path):
    if path:
        return json.load(open(path))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cmd = ["cargo", "rustdoc", "--lib", "--quiet"]
    if features:
        cmd += ["--features", features]
    cmd += ["--", "-Z", "unstable-options", "--output-format", "json", "--document-hidden-items"]
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run(cmd, cwd=root, env=env, check=True)
    meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                                     cwd=root, capture_output=True, check=True).stdout)
    return json.load(open(os.path.join(meta["target_directory"], "doc", "hotlimit.json")))


def walk(doc):
    index = doc["index"]
    fns, types, traits = {}, {}, {}
    seen = set()

    def item(i):
        return index.get(str(i))

    def public(it):
        return it["visibility"] == "public"

    def visit(i, path):
        it = item(i)
        if it is None or (i, path) in seen:
            return
        seen.add((i, path))
        kind, inner = next(iter(it["inner"].items()))
        name = it["name"]
        if kind == "use":
            target = inner.get("id")
            if target is None:
                return
            if inner["is_glob"]:
                t = item(target)
                if t and "module" in t["inner"]:
                    for c in t["inner"]["module"]["items"]:
                        if public(item(c) or {"visibility": ""}):
                            visit(c, path)
                return
            visit(target, path)
            return
        if not public(it) and kind != "module":
            return
        full = f"{path}::{name}" if path else name
        if kind == "module":
            if not public(it) and path:
                return
            for c in inner["items"]:
                visit(c, full)
        elif kind == "function":
            fns.setdefault(i, full)
        elif kind in ("struct", "enum", "union", "type_alias"):
            types.setdefault(i, full)
            for impl_id in inner.get("impls", []):
                imp = item(impl_id)["inner"]["impl"]
                if imp["trait"] is not None or imp.get("is_synthetic") or imp.get("blanket_impl"):
                    continue
                for m in imp["items"]:
                    mi = item(m)
                    if mi and public(mi) and "function" in mi["inner"]:
                        fns.setdefault(m, f"{full}::{mi['name']}")
        elif kind == "trait":
            traits.setdefault(i, full)
            for m in inner["items"]:
                mi = item(m)
                if mi and "function" in mi["inner"]:
                    fns.setdefault(m, f"{full}::{mi['name']}")

    visit(doc["root"], "")
    return fns, types, traits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--ratchet", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--features", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    fns, types, traits = walk(load(a.features, a.json))
    counts = {"pub fn": fns, "types": types, "traits": traits}
    over = grown = False
    for k, v in counts.items():
        bad = len(v) > TARGETS[k]
        # The ceilings are the default features' surface: another feature set is reported
        # against the targets only.
        up = not a.features and len(v) > CEILINGS[k]
        over |= bad
        grown |= up
        note = ("  OVER" if bad else "") + (f"  ABOVE ITS CEILING {CEILINGS[k]}" if up else "")
        print(f"{k:7} {len(v):4}  (target {TARGETS[k]}){note}")
        if a.list:
            for p in sorted(v.values()):
                print(f"    {p}")
    if (a.check and over) or (a.ratchet and grown):
        sys.exit(1)


if __name__ == "__main__":
    main()
