# Lists the public functions, classes and methods of the packages installed in
# this interpreter's environment, by reading their source with `ast` (nothing is
# imported, so no package code runs). One JSON object per line on stdout.
import ast, json, os, site, sys

SKIP_DIRS = {"tests", "test", "testing", "__pycache__", "_vendor", "vendor", "benchmarks", "examples", "docs"}
MAX_FILE = 1_000_000
MAX_ENTRIES = 300_000


def roots():
    seen = []
    cands = []
    try:
        cands += site.getsitepackages()
    except Exception:
        pass
    try:
        cands.append(site.getusersitepackages())
    except Exception:
        pass
    cands += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for c in cands:
        if c and os.path.isdir(c) and c not in seen:
            seen.append(c)
    return seen


def first_line(node):
    try:
        doc = ast.get_docstring(node)
    except Exception:
        doc = None
    if not doc:
        return ""
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def sig(fn, drop_self=False):
    try:
        args = fn.args
        if drop_self and args.args and args.args[0].arg in ("self", "cls"):
            args = ast.arguments(
                posonlyargs=args.posonlyargs, args=args.args[1:], vararg=args.vararg,
                kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                defaults=args.defaults[-len(args.args[1:]):] if args.args[1:] and args.defaults else [],
            )
        s = "(" + ast.unparse(args) + ")"
        if fn.returns is not None:
            s += " -> " + ast.unparse(fn.returns)
        return s[:400]
    except Exception:
        return "(...)"


count = 0
out = sys.stdout


def emit(module, name, kind, signature, doc):
    global count
    count += 1
    out.write(json.dumps({"m": module, "n": name, "k": kind, "s": signature, "d": doc}) + "\n")


def scan_file(path, module):
    try:
        if os.path.getsize(path) > MAX_FILE:
            return
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except Exception:
        return
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            emit(module, node.name, "function", sig(node), first_line(node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            init = next((b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == "__init__"), None)
            emit(module, node.name, "class", sig(init, True) if init else "()", first_line(node))
            for b in node.body:
                if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and not b.name.startswith("_"):
                    emit(module, node.name + "." + b.name, "method", sig(b, True), first_line(b))


def main():
    for root in roots():
        for entry in sorted(os.listdir(root)):
            if count >= MAX_ENTRIES:
                return
            full = os.path.join(root, entry)
            if entry.startswith(("_", ".")) or entry.endswith((".dist-info", ".egg-info", ".pth")):
                continue
            if os.path.isfile(full) and entry.endswith(".py"):
                scan_file(full, entry[:-3])
            elif os.path.isdir(full) and os.path.isfile(os.path.join(full, "__init__.py")):
                for dirpath, dirnames, filenames in os.walk(full):
                    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(("_", ".")))
                    rel = os.path.relpath(dirpath, root).replace(os.sep, ".")
                    for fn in sorted(filenames):
                        if not fn.endswith(".py") or (fn.startswith("_") and fn != "__init__.py") or fn.startswith("test_"):
                            continue
                        module = rel if fn == "__init__.py" else rel + "." + fn[:-3]
                        scan_file(os.path.join(dirpath, fn), module)
                        if count >= MAX_ENTRIES:
                            return


main()
out.flush()
