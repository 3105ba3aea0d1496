"""Splicing a regenerated section and target rows into docs/BENCHMARKS.md,
shared by the report scripts that own one section each (clitoken_report.py,
storescale_report.py): everything outside their markers and rows is left as
it was, hand-written sections included."""


def replace_section(doc, text, begin, end):
    """`doc` with the part from `begin` to `end` replaced by `text` (which
    carries both markers); without them, `text` goes before the Method
    section, or at the end when there is none."""
    if begin in doc and end in doc:
        a, b = doc.index(begin), doc.index(end) + len(end)
        return doc[:a] + text + doc[b:]
    marker = "\n## Method\n"
    if marker in doc:
        i = doc.index(marker)
        return doc[:i] + "\n" + text + "\n" + doc[i:]
    return doc.rstrip("\n") + "\n\n" + text + "\n"


def replace_target_rows(doc, rows):
    """`doc` with each (target, measured, met) row of the Targets table
    replaced (found by its first cell), or appended to the table when new."""
    lines = doc.split("\n")
    for row in rows:
        line = f"| {row[0]} | {row[1]} | {row[2]} |"
        for i, existing in enumerate(lines):
            if existing.startswith(f"| {row[0]} |"):
                lines[i] = line
                break
        else:
            for i, existing in enumerate(lines):
                if existing.startswith("## Targets"):
                    j = i + 1
                    while j < len(lines) and not lines[j].startswith("|"):
                        j += 1
                    while j < len(lines) and lines[j].startswith("|"):
                        j += 1
                    lines.insert(j, line)
                    break
    return "\n".join(lines)
