"""xtrain_lessons: the engine a learner builds in the xtrain-lessons course.

Each module holds the finished, tested version of one concept; the phase notebooks
(T01–T18) tell how it is built. Heavy or optional dependencies (CuPy, torch) are
imported lazily, so `import xtrain_lessons` is cheap and works on any CPU machine.
"""

__version__ = "0.1.0"
