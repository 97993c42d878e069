"""Which package modules, tests and notebook each phase of the course has: the one table that
CONTRIBUTING.md shows (`python tests/phase_map.py` prints it) and that the pytest markers use
(`pytest -m t05` runs T05's tests). tests/test_phase_map.py keeps the three in step.

The table itself lives in the package (`xtrain_lessons/course/phases.py`), beside what each phase
builds and how long its notebook runs: T00's roadmap and the book's course map come from it too."""

from xtrain_lessons.course.phases import PHASES  # noqa: F401  (phase -> (topic, modules, tests))


def phases_of_test(filename: str) -> list[str]:
    return [p for p, (_, _, tests) in PHASES.items() if filename in tests]


def markdown_table() -> str:
    rows = ["| phase | notebook | package modules (`xtrain_lessons/…`) | tests (`tests/…`) |",
            "|---|---|---|---|"]
    for phase, (topic, modules, tests) in PHASES.items():
        rows.append(f"| {phase} | `{phase}_{topic}` | " + ", ".join(f"`{m}`" for m in modules)
                    + " | " + ", ".join(f"`{t}`" for t in tests) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
