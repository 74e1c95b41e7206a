"""Install dflash-edge on an offline machine without pip: link our subpackages into SITE
(pyproject's package-dir).

    python3 scripts/gpu/install_offline.py SITE [WHEEL ...]      # then PYTHONPATH=SITE

Pure-Python wheels given after SITE are unzipped into it too (e.g. the `gguf` wheel for `fetch
--gguf`)."""

import sys
import zipfile
from pathlib import Path

import tomllib


def main(site: Path, wheels: list[str]) -> None:
    site.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        zipfile.ZipFile(wheel).extractall(site)
    dirs = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, src in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
        dest = site.joinpath(*name.split("."))
        if name == "dflash_edge":
            dest.mkdir(exist_ok=True)
            for f in Path(src).iterdir():
                (dest / f.name).unlink(missing_ok=True)
                (dest / f.name).symlink_to(f.resolve())
        elif not dest.exists():
            dest.symlink_to(Path(src).resolve())
    print("installed into", site, sorted(p.name for p in (site / "dflash_edge").iterdir()))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
