"""What the command line's parts share: the usage error, and reading --gpu and --model names."""

from __future__ import annotations


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit status 2."""



def _names_a_file(spec: str) -> bool:
    """Whether --model is written as a file path: a .json name, a path from the root, home or
    current folder, or more folders than a Hub id (owner/name) has. Such a name that does not
    exist is a missing file, not a preset or Hub id to look up."""
    s = spec.strip()
    return (s.lower().endswith(".json") or s.startswith(("/", "./", "../", "~"))
            or "\\" in s or s.count("/") > 1)



def gpu_name(spec: str) -> str:
    """The GPU named exactly (any case, any spacing), or the one GPU whose name contains
    `spec`. A spec that matches several is refused with those GPUs and a spelling that picks
    each; one that matches none, with every GPU."""
    import attnmem.calc

    names = list(attnmem.calc.GPUS)
    if spec in attnmem.calc.GPUS:
        return spec
    key = " ".join(spec.split()).lower()
    for name in names:
        if name.lower() == key:
            return name
    hits = [g for g in names if key and key in g.lower()]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UsageError(f"--gpu {spec[:60]!r} is not a GPU attnmem knows; give one of these "
                         f"names, or a part of one that no other has (e.g. 'H200'): "
                         f"{', '.join(names)}")
    picks = ", ".join(f"--gpu {_distinct_part(g, key, names)!r}" for g in hits[:3])
    raise UsageError(f"--gpu {spec[:60]!r} matches {len(hits)} GPUs: {', '.join(hits)}; give "
                     f"one of these names, or a part of one that no other has: {picks}"
                     + (", ..." if len(hits) > 3 else ""))



def _distinct_part(name: str, key: str, names: list[str]) -> str:
    """The shortest run of whole words of `name` that contains `key` and is in no other GPU's
    name (any case): what --gpu accepts for it, e.g. 'H100 NVL'. The full name if none is."""
    words = name.split()
    runs = [" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)]
    unique = [r for r in runs if key in r.lower()
              and sum(r.lower() in other.lower() for other in names) == 1]
    return min(unique, key=len, default=name)



def resolve_gpu(spec: str) -> int:
    """The bytes "fits" uses, as the pages do: the total torch can allocate where attnmem.calc.gpus has
    it (what torch.cuda.mem_get_info reports), else the spec-sheet figure."""
    from attnmem.calc.gpus import torch_total_bytes

    return torch_total_bytes(gpu_name(spec))
