#!/usr/bin/env python
"""Add the checksum (sha256) to committed records written before records carried one, or check them.

    python tools/record_checksums.py results/successors/study            # sign every record there
    python tools/record_checksums.py --check results/successors/study    # verify only; exit 1 if any fails

A JSON record (a study's cell and seed, its floors, a supplement) gets the field `sha256`, the
sha256 of the canonical JSON of its other fields (`dpm.readers.signed`), written atomically in the
compact layout the study writes; a study record of an evaluation (`results/evaluations/*.pt`) gets
the checksum `write_study` gives it (`dpm.checkpoints.checksum`). Sign a record only after checking
by other means that it is what it claims (e.g. that its K reproduces): the checksum then guards it.
A record that already carries a checksum that does not match is refused, never signed anew, and
so is a study record (NAME-seedN.json) whose fields are not what the study's reader needs.
"""
import argparse, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from dpm.readers import (RECORD_SUM, STUDY_RECORD, STUDY_RESULT, RecordError, check_fields,
                         read_record, read_study_record, record_sum, signed)
from dpm.checkpoints import checksum
from dpm.files import write_json, atomic_write


def records(paths) -> list:
    "The .json and .pt files named, and those in the folders named (at any depth)."
    out = []
    for p in map(Path, paths):
        if p.is_dir(): out += sorted(q for q in p.rglob('*') if q.suffix in ('.json', '.pt'))
        elif p.is_file(): out.append(p)
        else: raise SystemExit(f"record_checksums.py: {p}: no such file or folder")
    return out


def sign(path: Path, check_only: bool) -> str:
    "What was done to one record ('signed', 'ok', 'unsigned'); RecordError if it is refused."
    if path.suffix == '.pt':
        r = torch.load(path, weights_only=True)
        if not isinstance(r, dict) or 'key' not in r: raise RecordError(f"{path}: not a study record")
        body = {k: v for k, v in r.items() if k != RECORD_SUM}
        if RECORD_SUM in r:
            if r[RECORD_SUM] != checksum(body): raise RecordError(f"{path}: does not match its sha256")
            return 'ok'
        if check_only: return 'unsigned'
        atomic_write(path, lambda f: torch.save({**body, RECORD_SUM: checksum(body)}, f))
        return 'signed'
    import json
    study = re.fullmatch(r'.+-seed[0-9]+', path.stem) and path.parent.name != 'samples'
    try: return (read_study_record(path) if study else read_record(path)) and 'ok'
    except RecordError as e:
        if 'carries no checksum' not in str(e): raise
    if check_only: return 'unsigned'
    rec = signed(json.loads(path.read_text(encoding='utf-8')))
    if study: check_fields(rec, STUDY_RECORD, path) and rec['complete'] \
            and check_fields(rec, STUDY_RESULT, path)          # a record that does not fit: not signed
    write_json(rec, path, compact=True)
    assert read_record(path)[RECORD_SUM] == record_sum(read_record(path))
    return 'signed'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('paths', nargs='+', help='record files or folders of records')
    p.add_argument('--check', action='store_true', help='verify only: exit 1 if one is unsigned or fails')
    a = p.parse_args(argv)
    counts, bad = {}, 0
    for path in records(a.paths):
        try: done = sign(path, a.check)
        except (RecordError, OSError, ValueError, RuntimeError) as e:
            print(f"record_checksums.py: {e}", file=sys.stderr); bad += 1; continue
        counts[done] = counts.get(done, 0) + 1
        bad += done == 'unsigned' and a.check
    print(', '.join(f"{n} {what}" for what, n in sorted(counts.items())) or 'no records')
    if bad: sys.exit(1)


if __name__ == '__main__':
    main()
