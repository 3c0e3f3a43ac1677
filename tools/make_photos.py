"""Rebuild dpm/assets/photos: colour photographs from Debian's lomiri-wallpapers packages.

    python tools/make_photos.py DEB_DIR      # DEB_DIR holds the two .deb files below

Fetch the packages with `apt-get download lomiri-wallpapers-16.04=20.04.0-2
lomiri-wallpapers-20.04=20.04.0-2` (Debian 12). Each photograph is resized so that its shorter side
is 256 pixels by `dpm.data.resize_photo`, as `dpm.data` resizes every photograph of the CIFAR-10
stand-in, and written as a lossless PNG.
The illustrations of the packages (abstract patterns, drawn scenes) are left out. The script prints
the rows of `PHOTO_SHA256` for nbs/12_image_data.ipynb and writes photos.md, the provenance.
"""
import hashlib, re, subprocess, sys, tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from dpm.data import PHOTO_SCALES, PHOTOS_DEBIAN, resize_photo

DEBS = {'lomiri-wallpapers-16.04_20.04.0-2_all.deb':
        'a99ff6a3bfe451e4cc0682ecb3cc82e71740626d59e4845ae34a0a0e45421eab',
        'lomiri-wallpapers-20.04_20.04.0-2_all.deb':
        'd44e89b8473aafe64a5b678f014862dc31335aaaf18665c544d985d854f1a709'}
# file in /usr/share/backgrounds: (name, year); author and licence, as the packages' copyright files
# give them, are dpm.data.PHOTOS_DEBIAN's
PHOTOS = {
    'aitzgorri_by_Aitzol_Berasategi.jpg': ('aitzgorri', 2018),
    'Bridge_by_Sander_Klootwijk.jpg': ('bridge', 2018),
    'Dragonfly_by_Bolly.jpg': ('dragonfly', 2018),
    'free_by_Peter_Nerlich.jpg': ('free', 2018),
    'friends_by_Aitzol_Berasategi.jpg': ('friends', 2018),
    'greentock_by_Peter_Nerlich.jpg': ('greentock', 2018),
    'Kleiber_by_Lukas_Baubkus.jpg': ('kleiber', 2021),
    'life_by_Aitzol_Berasategi.jpg': ('life', 2018),
    'picosdeeuropa_by_Aitzol_Berasategi.jpg': ('picosdeeuropa', 2018),
    'Picture_0B_by_freespace.jpg': ('picture_0b', 2018),
    'Picture_1A_by_freespace.jpg': ('picture_1a', 2018),
    'seeding_by_Clements_Engelhardt.jpg': ('seeding', 2018),
    'sunset_by_Aitzol_Berasategi.jpg': ('sunset', 2018),
    'Wine_by_Jakkub_Mede.jpg': ('wine', 2018),
}
SHORTER_SIDE = PHOTO_SCALES[-1]            # the largest scale dpm.data uses


def sha256(path) -> str: return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(deb_dir: Path, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    rows, found = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for deb, digest in DEBS.items():
            if sha256(deb_dir / deb) != digest: sys.exit(f"{deb}: sha256 is not {digest}")
            subprocess.run(['dpkg-deb', '-x', str(deb_dir / deb), f'{tmp}/{deb}'], check=True)
            for f in Path(tmp, deb, 'usr/share/backgrounds').glob('*.jpg'):
                if f.name in PHOTOS: found[f.name] = (deb, f)
        for src, (name, year) in sorted(PHOTOS.items(), key=lambda kv: kv[1][0]):
            deb, f = found[src]
            licence, author = re.fullmatch(r'(.+) \((.+)\)', PHOTOS_DEBIAN[name]).groups()
            author = f'{author}, {year}'
            with Image.open(f) as im: img = np.asarray(im.convert('RGB'))
            png = out / f'{name}.png'
            Image.fromarray(resize_photo(img, SHORTER_SIDE)).save(png, optimize=True)
            rows.append((name, src, deb, sha256(f), img.shape, author, licence, sha256(png)))
    lines = ["# photos — provenance", "",
             "Colour photographs for the CIFAR-10 stand-in (`dpm.data`, chapter 12), from Debian 12's",
             "packages `lomiri-wallpapers-16.04` and `lomiri-wallpapers-20.04`, version 20.04.0-2",
             "(upstream https://gitlab.com/ubports/development/core/lomiri-wallpapers). Each file is the",
             f"photograph resized to a shorter side of {SHORTER_SIDE} pixels by `tools/make_photos.py`",
             "(anti-aliased, rounded to 8 bits), stored as a lossless PNG. Authors and licences are those",
             "of the packages' copyright files; the resized copies keep each photograph's licence",
             "(CC BY and CC BY-SA: credit the author, and share derivatives of a BY-SA photograph alike).",
             "", "| file | photograph (package file) | author | licence | original size | "
             "sha256 of the original | sha256 of the PNG |", "|---|---|---|---|---|---|---|"]
    for name, src, deb, src_sha, shape, author, licence, png_sha in rows:
        lines.append(f"| {name}.png | {src} ({deb.split('_')[0]}) | {author} | {licence} | "
                     f"{shape[1]}x{shape[0]} | {src_sha} | {png_sha} |")
    lines += ["", "Licences: CC BY 4.0 https://creativecommons.org/licenses/by/4.0/; CC BY-SA 4.0",
              "https://creativecommons.org/licenses/by-sa/4.0/; CC BY-SA 3.0",
              "https://creativecommons.org/licenses/by-sa/3.0/; CC0 1.0",
              "https://creativecommons.org/publicdomain/zero/1.0/.", "",
              "Package sha256: " + "; ".join(f"{d}: {s}" for d, s in DEBS.items()), ""]
    (out / 'photos.md').write_text('\n'.join(lines))
    for name, src, deb, src_sha, shape, author, licence, png_sha in rows:
        print(f"    '{name}': '{png_sha}',")


if __name__ == '__main__':
    main(Path(sys.argv[1]), Path(__file__).resolve().parents[1] / 'dpm' / 'assets' / 'photos')
