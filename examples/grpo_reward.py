"""An example reward for `xtrain grpo` (T21): a friendly story.

    xtrain grpo runs/mine --reward examples/grpo_reward.py:friendly

A reward is any function (prompt: str, completion: str) -> float. The completion is the
decoded text of the new tokens; it ends with "<|endoftext|>" when the model stopped there.
"""

import re

WORDS = ("friend", "happy", "smile")


def friendly(prompt: str, completion: str) -> float:
    """1/3 for each of 'friend', 'happy' and 'smile' (in any form: friends, smiled, ...)."""
    text = completion.lower()
    return sum(1 for w in WORDS if re.search(rf"\b{w}", text)) / len(WORDS)
