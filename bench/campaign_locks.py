"""Lock files of a campaign's jobs (bench/successors_factorial.py): a lock names the worker that
holds it ('pid N on HOST'); a lock whose process is gone on this host is taken over, and said so."""
import os, platform
from pathlib import Path


def lock_owner(lock: Path):
    "(pid, host) that a lock file names ('pid N on HOST'), or None if it names none (yet)."
    try: words = lock.read_text(encoding='utf-8', errors='replace').split()
    except OSError: return None
    if len(words) >= 4 and words[0] == 'pid' and words[1].isascii() and words[1].isdigit() \
            and words[2] == 'on': return int(words[1]), ' '.join(words[3:])
    return None


def owner_alive(owner) -> bool:
    "Whether a lock's process runs: on another host it cannot be told, so it counts as running."
    if owner is None or owner[1] != platform.node(): return True
    try: os.kill(owner[0], 0)
    except ProcessLookupError: return False
    except (PermissionError, OverflowError): return True
    return True


def claim(lock: Path, say=print) -> bool:
    """Create the lock file naming this process ('pid N on HOST'), or False if a running worker
    has it; a lock whose process is gone (a worker killed) is taken over, and said so."""
    for _ in range(3):
        try: fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            owner = lock_owner(lock)
            if owner_alive(owner): return False
            stale = lock.with_name(f'{lock.name}.stale.{os.getpid()}')
            try: os.rename(lock, stale)                       # one taker wins the rename
            except FileNotFoundError: continue
            if lock_owner(stale) != owner:                    # a fresh lock taken by mistake
                os.rename(stale, lock); return False
            stale.unlink(missing_ok=True)
            say(f"{lock.name}: its worker (pid {owner[0]} on {owner[1]}) is gone: "
                f"taking the job over", flush=True)
            continue
        with os.fdopen(fd, 'w') as f: f.write(f'pid {os.getpid()} on {platform.node()}\n')
        return True
    return False


def lock_state(lock: Path) -> str:
    "What --list says of a job's lock: '' if none."
    if not lock.exists(): return ''
    owner = lock_owner(lock)
    if owner is None: return 'locked (no owner named: remove the lock if no worker runs)'
    return (f"locked by pid {owner[0]} on {owner[1]} "
            f"({'running' if owner_alive(owner) else 'gone: the next worker takes it over'})")
