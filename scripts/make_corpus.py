"""Generate data/stories.txt: short, simple stories for the course's tiny language model.

The stories are written by a small story grammar (this file) from word material written
for this project (scripts/corpus_material/lexicon.py). Generation is deterministic: the
same seed gives the same file, byte for byte, on any machine.

    python scripts/make_corpus.py              # write data/stories.txt and print stats
    python scripts/make_corpus.py --check      # exit 1 if the committed file differs
    python scripts/make_corpus.py --n 50 --out /tmp/s.txt

How it works: a story "shape" (lost thing found, sharing, a new friend, ...) is a list of
beats; each beat picks one of several sentence templates. A template holds fields
`{A}`, `{A.he}`, `{O.the}` filled from the story's cast, and inline choices `[a|b|c]`.
A final pass fixes a/an, capital letters and spacing. Stories are separated by a line
`<|endoftext|>`.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus_material"))
import lexicon as L  # noqa: E402

for _place in L.PLACES:  # "went to the park", "went home"
    _place.setdefault("to", "home" if _place["name"] == "the house" else "to " + _place["name"])

EOT = "<|endoftext|>"
DEFAULT_SEED = 1234
DEFAULT_N = 3600
DEFAULT_OUT = HERE.parent / "data" / "stories.txt"
MIN_WORDS, MAX_WORDS = 80, 250


# --------------------------------------------------------------------------- the cast
class Who:
    """A character: name plus the pronouns and verb forms that agree with it."""

    _FORMS = {
        "he": dict(he="he", him="him", his="his", himself="himself", was="was", has="has", is_="is"),
        "she": dict(he="she", him="her", his="her", himself="herself", was="was", has="has", is_="is"),
        "they": dict(he="they", him="them", his="their", himself="themselves", was="were", has="have",
                     is_="are"),
        "it": dict(he="it", him="it", his="its", himself="itself", was="was", has="has", is_="is"),
    }

    def __init__(self, name: str, pron: str, kind: str, noun: str = "", rel: str = ""):
        self.name, self.pron, self.kind, self.noun, self.rel = name, pron, kind, noun, rel
        for k, v in self._FORMS[pron].items():
            setattr(self, k, v)
        self.He, self.Him, self.His = self.he.capitalize(), self.him.capitalize(), self.his.capitalize()
        self.Was = self.was.capitalize()

    def __str__(self) -> str:
        return self.name


class Thing:
    """An object: {O} is the bare noun, {O.full} adds its adjective, {O.the}/{O.a}/{O.my}."""

    def __init__(self, noun: str, adj: str):
        self.noun, self.adj = noun, adj
        self.full = f"{adj} {noun}"
        self.the, self.a, self.the_n = f"the {self.full}", f"a {self.full}", f"the {noun}"

    def __str__(self) -> str:
        return self.noun


def make_kid(rng: random.Random, exclude=()) -> Who:
    while True:
        r = rng.random()
        if r < 0.45:
            w = Who(rng.choice(L.BOYS), "he", "kid", "boy")
        elif r < 0.9:
            w = Who(rng.choice(L.GIRLS), "she", "kid", "girl")
        else:
            w = Who(rng.choice(L.THEY_KIDS), "they", "kid", "kid")
        if w.name not in exclude:
            return w


def make_animal(rng: random.Random, exclude=()) -> Who:
    while True:
        species, names, pron = rng.choice(L.ANIMALS)
        name = rng.choice(names)
        if name not in exclude:
            return Who(name, pron, "animal", species)


def make_parent(rng: random.Random) -> Who:
    name, rel = rng.choice(L.PARENTS)
    return Who(name, L.PARENT_PRONOUN[name], "adult", rel, rel)


def make_thing(rng: random.Random, pool) -> Thing:
    noun, adjs = rng.choice(pool)
    return Thing(noun, rng.choice(adjs))


# --------------------------------------------------------------------------- templates
_CHOICE = re.compile(r"\[([^\[\]]*)\]")
_FIELD = re.compile(r"\{(\w+)(?:\.(\w+))?\}")


def fill(template: str, ctx: dict, rng: random.Random) -> str:
    """Resolve `[a|b]` choices, then `{X}` / `{X.attr}` fields (bare pronouns mean A's)."""
    text = _CHOICE.sub(lambda m: rng.choice(m.group(1).split("|")), template)

    def field(m: re.Match) -> str:
        key, attr = m.group(1), m.group(2)
        if key in ctx:
            v = ctx[key]
            return str(getattr(v, attr) if attr else v)
        return str(getattr(ctx["A"], key))  # {he}, {his}, {him}: the main character's

    for _ in range(3):  # material inserted by a field may hold fields itself
        text = _FIELD.sub(field, text)
    return _CHOICE.sub(lambda m: rng.choice(m.group(1).split("|")), text)


def say(rng: random.Random, who: Who, line: str, verb: str | None = None, mood: str = "") -> str:
    """One line of dialogue with varied attribution and correct punctuation.

    mood "bad" marks an unhappy line, so the speaker frowns instead of grinning.
    """
    end = line[-1]
    if verb is None:
        if end == "?":
            verb = "asked"
        elif end == "!":
            verb = rng.choice(["said", "said", "shouted", "cried"])
        else:
            verb = rng.choice(["said", "said", "said", "said", "whispered"])
    inner = line[:-1] + "," if end == "." else line
    form = rng.randrange(4)
    if form == 0:
        return f'"{inner}" {verb} {who}.'
    if form == 1:
        return f'{who} {verb}, "{line}"'
    if form == 2:
        return f'"{inner}" {who} {verb}.'
    if mood == "bad":
        action = rng.choice(["frowned", "sighed", f"shook {who.his} head", f"crossed {who.his} arms"])
    elif end == "?":
        action = rng.choice(["looked up", f"tilted {who.his} head", "came closer"])
    elif end == "!":
        action = rng.choice(["jumped up", "clapped", "laughed", "grinned"])
    else:
        action = rng.choice(["smiled", "nodded", "smiled kindly"])
    return f'{who} {action}. "{line}"'


def pick(rng: random.Random, options: list[str]) -> str:
    return rng.choice(options)


_AN = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")
_CAP_SENT = re.compile(r'([.!?] +"?)([a-z])')
_CAP_QUOTE = re.compile(r'(, ")([a-z])')


def tidy(text: str) -> str:
    """a -> an before a vowel, capital letters at sentence starts, single spaces."""
    text = _AN.sub(lambda m: m.group(1) + "n ", text)
    text = re.sub(r" +", " ", text)
    text = _CAP_SENT.sub(lambda m: m.group(1) + m.group(2).upper(), text)
    text = _CAP_QUOTE.sub(lambda m: m.group(1) + m.group(2).upper(), text)
    lines = []
    for line in text.split("\n"):
        line = line.strip()
        i = 1 if line.startswith('"') else 0
        lines.append(line[:i] + line[i:i + 1].upper() + line[i + 1:])
    return "\n".join(lines)


# --------------------------------------------------------------------------- shared beats
def opening(rng: random.Random, c: dict) -> str:
    """The first sentence, sometimes followed by a detail or two about the main character."""
    A = c["A"]
    if A.kind == "animal":
        first = pick(rng, [
            "Once upon a time, there was a [little|small|young] {A.noun} named {A}.",
            "Once upon a time, in a [quiet|green|sunny] [wood|valley|place], there lived a "
            "[little|small|happy|curious] {A.noun} called {A}.",
            "There was once a [little|young|friendly|curious] {A.noun}. {A.His} name was {A}.",
            "{A} was a [little|small|happy|busy] {A.noun} who [loved to play|liked to run and jump|"
            "was always curious|had many friends].",
            "Not far from here, there lived a [little|young|cheerful] {A.noun} named {A}.",
        ])
        details = [
            "{A.He} lived [in a cozy home under a big tree|near a little river|at the edge of the woods|"
            "by a sunny hill] with {A.his} {P.rel}.",
            "{A.He} liked [sweet berries|the warm sun|playing games|running fast|looking at the clouds|"
            "splashing in puddles].",
            "Every morning, {A.he} said hello to the [sun|birds|flowers|trees].",
            "{A.He} was small, but {A.he} had a big heart.",
        ]
    else:
        first = pick(rng, [
            "Once upon a time, there was a [little|young|happy|kind|curious] {A.noun} named {A}.",
            "There was once a [little|young|cheerful|curious] {A.noun} called {A}.",
            "{A} was [four|five|six|seven] years old.",
            "Once there was a {A.noun} named {A} who [loved to play|liked to sing|was always busy|"
            "had a big smile].",
            "{A} was a [little|kind|busy|brave|happy] {A.noun} who lived [in a small house|near the park|"
            "in a blue house|on a quiet street] with {A.his} {P.rel}.",
            "In a little town by the sea, there lived a {A.noun} named {A}.",
        ])
        details = [
            "{A.He} had [curly hair|freckles on {A.his} nose|big brown eyes|a gap in {A.his} smile|"
            "a yellow raincoat|red rain boots].",
            "{A.His} favorite color was [red|blue|green|yellow|purple|orange|pink].",
            "{A.He} liked [to draw|to sing|dinosaurs|to help in the kitchen|stories about the sea|"
            "to build things|bugs and worms|to dance].",
            "{A.He} had a [little|big] [sister|brother] and a [cat|dog|fish|hamster] named "
            "[Pepper|Noodle|Bean|Sunny|Pickles|Mochi].",
            "Everyone said {A.he} {A.was} [kind|funny|clever|gentle|full of ideas].",
        ]
    parts = [fill(first, c, rng)]
    if rng.random() < 0.5:
        parts += [fill(d, c, rng) for d in rng.sample(details, rng.choice([1, 1, 2]))]
    return " ".join(parts)


def time_phrase(rng: random.Random) -> str:
    return pick(rng, ["One day", "One morning", "One sunny day", "One afternoon", "One bright morning",
                      "On a warm day", "One Saturday", "Early one morning", "After lunch one day"])


def ending(rng: random.Random, c: dict, moral: list[str]) -> str:
    """A closing feeling plus, often, a moral line (c["AWAY"]: the story happened away from home)."""
    away = c.get("AWAY", False)
    closes = [
        "{A} was very [happy|glad|proud].",
        "{A} smiled a big smile.",
        "It was a [good|great|happy|wonderful] day.",
        "That night, {A} fell asleep with a smile.",
        "{A} felt warm [inside|and happy].",
        "{A}'s heart felt full and light.",
    ]
    if away:
        closes.append("{A} went home with a happy heart.")
    close = fill(pick(rng, closes), c, rng)
    if rng.random() < 0.75:
        close += " " + fill(pick(rng, moral), c, rng)
    return close


def scenery(rng: random.Random, c: dict, p: float = 0.6) -> list[str]:
    """Sometimes one sentence about what the place looks like (an empty list otherwise)."""
    if rng.random() >= p:
        return []
    Pl = c["L"]
    s1, s2 = rng.sample(Pl["see"], 2)
    options = ["{A.He} saw " + s1 + " and " + s2 + ".",
               "{A.He} [looked at|smiled at|stopped to watch] " + s1 + "."]
    if Pl["name"] not in ("the house", "school"):
        options += ["It was a [warm|bright|sunny|cool|lovely] day, and the sky was [blue|clear|"
                    "full of fluffy clouds].",
                    "[Birds were singing in the trees.|A soft wind was blowing.|The sun felt warm on "
                    "{A.his} face.]"]
    return [fill(pick(rng, options), c, rng)]


def feeling(rng, good=True) -> str:
    return rng.choice(L.FEELINGS_GOOD if good else L.FEELINGS_SAD)


# --------------------------------------------------------------------------- story shapes
def lost_thing(rng: random.Random, c: dict) -> list[str]:
    A, P, O, Pl = c["A"], c["P"], c["O"], c["L"]
    spots = rng.sample(Pl["spots"], 3)
    c.update(S1=spots[0], S2=spots[1], S3=spots[2], PLAY=rng.choice(Pl["play"]))
    p1 = [opening(rng, c), fill(pick(rng, [
        "{A} had {O.a}. It was {A.his} favorite [toy|thing in the world].",
        "{A.His} favorite thing was {O.a}. {A.He} took it everywhere.",
        "{A} loved {A.his} {O.full} very much.",
        "{A.He} had {O.a} that {A.his} {P.rel} gave {A.him}. {A.He} loved it so much.",
    ]), c, rng)]
    p1.append(fill(f"{time_phrase(rng)}, {{A}} took the {{O}} {Pl['to']}. {{A.He}} {{PLAY}}"
                   "[ for a long time| all morning| with a big smile|].", c, rng))
    p1 += scenery(rng, c)
    p2 = [fill(pick(rng, [
        "When it was time to go, {A} looked for the {O}. It was gone!",
        "After a while, {A} looked down. The {O} was not there!",
        "Then {A} wanted to play with the {O}, but {A.he} could not find it.",
    ]), c, rng), fill(pick(rng, [
        "{A} felt [very |]{F}. {A.His} eyes filled with tears.",
        "{A.His} lip began to shake. {A.He} felt so {F}.",
        "{A} sat down and began to cry.",
    ]), {**c, "F": feeling(rng, False)}, rng)]
    helper = c["B"]
    p2.append(say(rng, helper, fill(pick(rng, [
        "Do not worry. We will find it together.",
        "What is wrong, {A}? Did you lose something?",
        "Let us look for it. Two pairs of eyes are better than one.",
    ]), c, rng)))
    p3 = [fill(pick(rng, [
        "They looked {S1}. It was not there. They looked {S2}. It was not there either.",
        "First they looked {S1}, but they only found a [leaf|stick|bug|button]. Next they looked {S2}. "
        "Nothing.",
        "{A} and {B} looked {S1} and {S2}, but the {O} was nowhere.",
    ]), c, rng), fill(pick(rng, [
        "Then {B} [shouted|called|pointed], \"Look, {S3}!\" There was the {O}!",
        "At last, {A} saw something {S3}. It was the {O}!",
        "Then {A} remembered playing {S3}. {A.He} ran to look, and there it was!",
    ]), c, rng)]
    p4 = [fill(pick(rng, [
        "{A} hugged the {O} tight. \"Thank you, {B}!\" {A.he} said.",
        "{A} picked up the {O} and laughed. \"You are a good friend, {B},\" {A.he} said.",
        "{A} was so {F} to have the {O} back. {A.He} thanked {B} [again and again|with a big hug].",
    ]), {**c, "F": feeling(rng)}, rng), ending(rng, c, [
        "From then on, {A} always kept the {O} [close|safe|in {A.his} pocket].",
        "{A} learned to take good care of the things {A.he} loved.",
        "{A} knew that friends help when things go wrong.",
        "After that, {A} always looked twice before leaving.",
    ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def sharing(rng: random.Random, c: dict) -> list[str]:
    A, B = c["A"], c["B"]
    food = rng.random() < 0.4
    c["O"] = O = make_thing(rng, L.FOODS if food else L.TOYS)
    verb = "eat" if food else "play with"
    c["V"] = verb
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A}} had {{O.a}}. {{A.He}} [did not want to share it|wanted it all for "
        "{A.himself}|held it close].",
        f"{time_phrase(rng)}, {{A.his}} {{P.rel}} gave {{A.him}} {{O.a}}. {{A}} was very {feeling(rng)}.",
    ]), c, rng), fill(f"{{A}} went {c['L']['to']}.", c, rng)]
    p1 += scenery(rng, c, 0.5)
    p1.append(fill("[There|Soon] {A.he} saw {B}.", c, rng))
    p2 = [fill(pick(rng, [
        "{B} looked at the {O}. {B} had nothing to " + verb + ".",
        "{B} was sitting alone. {B.He} looked at the {O} with big eyes.",
        "{B} had forgotten {B.his} [lunch|snack|toys] at home. {B.He} looked {F}.",
    ]), {**c, "F": feeling(rng, False)}, rng)]
    p2.append(say(rng, B, fill(pick(rng, [
        "That looks yummy. Can I have a bite?", "Can I have a little bit, please?",
        "I am so hungry. Can I have some too?",
    ] if food else [
        "Can I play with it too?", "That looks fun. May I have a turn?", "Can we play with it together?",
    ]), c, rng)))
    p2.append(say(rng, A, pick(rng, ["No, it is mine!", "No. I want it all.", "Not now. Go away!"]), mood="bad"))
    p3 = [fill(pick(rng, [
        "{B} walked away and sat down. {B.He} looked very sad.",
        "{B}'s face fell. {B.He} turned and walked slowly away.",
        "{B} did not say anything. {B.He} just looked at the ground.",
    ]), c, rng), fill(pick(rng, [
        "{A} looked at {B}. Then {A.he} looked at the {O}. {A.He} did not feel good inside.",
        "{A} felt a funny feeling in {A.his} tummy. Being mean was not fun.",
        "{A} remembered what {A.his} {P.rel} said: \"Sharing makes everyone happy.\"",
    ]), c, rng)]
    if food:
        share = "{A} broke the {O} in two and gave half to {B}."
    else:
        share = "{A} ran after {B} and held out the {O}."
    p3.append(fill(share, c, rng))
    p3.append(say(rng, A, pick(rng, ["I am sorry. Let us share.", "Here, you can have some too.",
                                     "Let us eat it together."] if food else
                               ["I am sorry. Let us share.", "Here, you can play with it too.",
                                "We can take turns. You go first!"])))
    p4 = [fill(pick(rng, [
        "{B} smiled from ear to ear. \"Thank you, {A}!\"",
        "{B} was so happy. {B.He} gave {A} a big hug.",
        "{B}'s eyes lit up. \"You are kind, {A},\" {B.he} said.",
    ]), c, rng), fill(pick(rng, [
        "They [ate|had] it together under a tree. It tasted even better when they shared it."
        if food else "They played with the {O} together all afternoon. It was more fun with two.",
        "They laughed and talked [until the sun went down|for a long time|all afternoon].",
    ]), c, rng), ending(rng, c, [
        "{A} learned that sharing is better than keeping things to yourself.",
        "{A} learned that when you share, you make a friend.",
        "From that day on, {A} and {B} shared everything.",
        "Sharing made two friends happy instead of one.",
    ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def new_friend(rng: random.Random, c: dict) -> list[str]:
    A, B, Pl = c["A"], c["B"], c["L"]
    c["PLAY"] = rng.choice(Pl["play"])
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A}} went {Pl['to']}. {{A.He}} saw a {{B.noun}} {{A.he}} had never seen "
        "before. {B.His} name was {B}.",
        "{A} did not have many friends. {A.He} often played alone " + Pl["at"] + ".",
        f"{time_phrase(rng)}, a new {{B.noun}} came {Pl['to']}. {{B.His}} name was {{B}}.",
    ]), c, rng)]
    p1.append(fill(pick(rng, [
        "{B} was standing all alone. {B.He} looked shy.",
        "{B} was sitting by {B.himself}. {B.He} did not know anyone.",
        "{B} looked a little lonely.",
    ]), c, rng))
    p2 = [fill(pick(rng, [
        "{A} felt shy too, but {A.he} walked over.",
        "{A} took a deep breath and went to say hello.",
        "{A} wanted to say hello, but {A.his} cheeks felt hot. Then {A.he} {A.was} brave.",
    ]), c, rng)]
    p2.append(say(rng, A, fill(pick(rng, [
        "Hi! I am {A}. What is your name?", "Hello! Do you want to play with me?",
        "Hi there. Are you new here?",
    ]), c, rng)))
    p2.append(say(rng, B, fill(pick(rng, [
        "I am {B}. Yes, I would like to play!", "My name is {B}. I just moved here.",
        "I am {B}. Can we play together?",
    ]), c, rng)))
    p3 = [fill(pick(rng, [
        "So {A} and {B} {PLAY}.", "Together they {PLAY}.",
        "They {PLAY}. Then they {PLAY2}.",
    ]), {**c, "PLAY2": rng.choice(Pl["play"])}, rng), fill(pick(rng, [
        "{B} told funny jokes, and {A} laughed and laughed.",
        "They found out they both liked [dogs|drawing|the color blue|songs about the sea|jumping].",
        "{B} showed {A} how to [whistle|do a cartwheel|make a paper hat|hop on one foot].",
        "They shared a [snack|secret|song] and talked about everything.",
    ]), c, rng)]
    p4 = [fill(pick(rng, [
        "When it was time to go home, {B} asked, \"Can we play again tomorrow?\"",
        "At the end of the day, {A} said, \"You are my new friend, {B}.\"",
        "When the sun went down, they waved goodbye. \"See you tomorrow!\" they said.",
    ]), c, rng), ending(rng, c, [
        "{A} learned that a friend can be just one hello away.",
        "From that day on, {A} and {B} were best friends.",
        "{A} was glad {A.he} had been brave enough to say hello.",
        "Sometimes the best friends are the ones you have not met yet.",
    ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def fear_overcome(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    fears = L.FEARS if A.kind != "animal" else [f for f in L.FEARS if f[0] in L.ANIMAL_FEARS]
    thing, line, act, after = rng.choice(fears)
    c.update(FEAR=thing, ACT=act, AFTER=after)
    p1 = [opening(rng, c), fill(pick(rng, [
        "{A} was afraid of {FEAR}.", "There was one thing {A} did not like: {FEAR}.",
        "{A} was brave about many things, but {A.he} {A.was} scared of {FEAR}.",
    ]), c, rng)]
    p1.append(say(rng, A, line, mood="bad"))
    p2 = [fill(pick(rng, [
        "{P} [sat down next to {A}|knelt down beside {A}|held {A}'s hand].",
        "{P} gave {A} a [warm|big|gentle] hug.",
    ]), c, rng)]
    p2.append(say(rng, P, pick(rng, [
        "It is okay to be scared. Being brave means trying anyway.",
        "I will be right here. You can do it.",
        "Let us try together, one little step at a time.",
        "When I was little, I was scared too. Then I tried, and it was not so bad.",
    ])))
    p3 = [fill(pick(rng, [
        "{A} took a deep breath. Then {A.he} {ACT}.",
        "{A.His} heart beat fast, but {A.he} {ACT}.",
        "{A} counted to three. One, two, three! {A.He} {ACT}.",
    ]), c, rng), fill(pick(rng, [
        "And then, {AFTER}.", "It was not scary at all. {AFTER}.", "To {A.his} surprise, {AFTER}.",
    ]), c, rng)]
    p4 = [say(rng, A, pick(rng, ["I did it! I was brave!", "That was not so bad!",
                                 "I am not scared anymore!", "Can I do it again?"])),
          fill(pick(rng, ["{P} smiled. \"I am so proud of you,\" {P.he} said.",
                          "{P} clapped {P.his} hands and cheered.",
                          "{P} gave {A} a high five."]), c, rng),
          ending(rng, c, [
              "{A} learned that being brave does not mean you are not scared.",
              "Now {A} is not afraid of {FEAR} anymore.",
              "{A} learned that many scary things are not so scary when you try.",
              "From then on, whenever {A} was scared, {A.he} remembered that day.",
          ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def weather(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    kind, starts, plan, funs = rng.choice(L.WEATHER)
    fun = rng.choice(funs)
    c.update(PLAN=plan, START1=starts[0], START2=rng.choice(starts[1:]), FUN=fun)
    p1 = [opening(rng, c), fill(pick(rng, [
        "{A} wanted to {PLAN} today. {A.He} had been waiting all week.",
        "Today was the day {A} and {A.his} {P.rel} were going to {PLAN}.",
        "{A} woke up early. \"Today we will {PLAN}!\" {A.he} said.",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "But then {START1}. Soon {START2}.", "Then {A} looked out the window. {START1}!",
        "But after breakfast, {START1}, and {START2}.",
    ]), c, rng)]
    p2.append(say(rng, A, pick(rng, ["Oh no! Now we cannot go.", "This is not fair!",
                                     "Why does the weather have to spoil everything?"]), mood="bad"))
    p2.append(fill(pick(rng, ["{A} felt {F} and sat by the window.",
                              "{A} put {A.his} chin in {A.his} hands. {A.He} felt {F}."]),
                   {**c, "F": feeling(rng, False)}, rng))
    p3 = [say(rng, P, pick(rng, [
        "We can still have fun. Let me show you.", "Every kind of weather has its own fun.",
        "I have an idea. Come with me!",
    ])), fill(pick(rng, ["So they {FUN}.", "That day, {A} and {P} {FUN}.",
                         "{P} and {A} {FUN}. {A} laughed a lot."]), c, rng)]
    p4 = [say(rng, A, pick(rng, ["This is the best day ever!", "I did not know the " + kind +
                                 " could be so much fun!", "Can we do this again tomorrow?"])),
          ending(rng, c, [
              "{A} learned that a change of plans can still be a happy day.",
              "Now {A} does not mind the " + kind + " so much.",
              "{A} learned that you can find fun in any weather.",
              "The next day, they went to {PLAN} after all, and it was fun too.",
          ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def trip(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    place, sights, events = rng.choice(L.TRIPS)
    s = rng.sample(sights, 3)
    c.update(TO=place, S1=s[0], S2=s[1], S3=s[2], EV=rng.choice(events))
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A}} and {{A.his}} {{P.rel}} went to {{TO}}.",
        "{P} said, \"Today we are going to {TO}!\" {A} jumped up and down.",
        "{A} had never been to {TO}. Today {A.he} {A.was} going for the first time.",
    ]), c, rng), fill(pick(rng, [
        "They packed [a lunch|some snacks|water and apples] and got in the [car|bus|train].",
        "The ride was long, but {A} looked out the window the whole way.",
        "{A} was so {F} that {A.he} could not sit still.",
    ]), {**c, "F": feeling(rng)}, rng)]
    p2 = [fill(pick(rng, [
        "At {TO}, they saw {S1}. Then they saw {S2} and {S3}.",
        "First they saw {S1}. {A} [liked|loved] it. Next they saw {S2}. Then they saw {S3}.",
        "There were so many things to see: {S1}, {S2} and {S3}.",
    ]), c, rng)]
    p2.append(say(rng, A, pick(rng, ["Look at that!", "Wow! Can we stay here all day?",
                                     "This is the best place in the world!"])))
    p3 = [fill(pick(rng, ["Then something funny happened: {EV}.", "The best part was when {EV}.",
                          "Later, {EV}. {A} laughed and laughed."]), c, rng)]
    p4 = [fill(pick(rng, [
        "At the end of the day, they drove home. {A} was tired but happy.",
        "On the way home, {A} fell asleep in the car.",
        "When they got home, {A} told {A.his} [toys|cat|teddy bear] all about the trip.",
    ]), c, rng), ending(rng, c, [
        "{A} hoped they would go back to {TO} soon.",
        "{A} would always remember the day at {TO}.",
        "{A} learned that the world is full of wonderful things to see.",
        "That night, {A} dreamed about {S1}.",
    ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def helping_hand(rng: random.Random, c: dict) -> list[str]:
    A, B = c["A"], c["B"]
    prob, fix, thanks = rng.choice(L.HELP_PROBLEMS)
    c.update(PROB=prob, FIX=fix)
    p1 = [opening(rng, c), fill(
        f"{time_phrase(rng)}, {{A}} was on {{A.his}} way home from {c['L']['name']}. "
        "[Suddenly, |On the way, |Then |]{A.he} saw {PROB}." if c["L"]["name"] != "the house" else
        f"{time_phrase(rng)}, {{A}} was walking down the street. [Suddenly, |Then |]{{A.he}} saw {{PROB}}.",
        c, rng)]
    p1.append(fill(pick(rng, [
        "{B} stood next to it. {B.He} looked [sad|worried|upset].",
        "{B} was there too, and {B.he} did not know what to do.",
        "Nearby, {B} was trying to help, but it was too hard to do alone.",
    ]), c, rng))
    p2 = [say(rng, A, pick(rng, ["Can I help?", "Do you need help?", "Do not worry. I will help you!"])),
          fill(pick(rng, [
              "{A} thought for a moment. Then {A.he} {FIX}.",
              "{A} did not give up. {A.He} {FIX}.",
              "It was not easy, but {A} {FIX}.",
          ]), c, rng)]
    p3 = [say(rng, B, thanks), fill(pick(rng, [
        "{A} felt warm and happy inside.", "{A} smiled. Helping felt good.",
        "{A} felt proud. It is nice to help others.",
    ]), c, rng)]
    if rng.random() < 0.5:
        p3.append(fill(pick(rng, [
            "The next day, {B} brought {A} a [drawing|cookie|flower] to say thank you.",
            "After that, {A} and {B} became good friends.",
            "{B} said, \"If you ever need help, I will help you too.\"",
        ]), c, rng))
    p4 = [ending(rng, c, [
        "{A} learned that a little help can make a big difference.",
        "Being kind is always a good choice.",
        "When we help each other, everyone is happy.",
        "{A} knew that helping others is one of the best things to do.",
    ])]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def bedtime(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    c.update(HELP=rng.choice(L.BEDTIME_HELPS), DREAM=rng.choice(L.DREAMS))
    p1 = [opening(rng, c), fill(pick(rng, [
        "It was time for bed, but {A} was not sleepy at all.",
        "One night, {A} could not fall asleep.",
        "The moon was up and the house was quiet, but {A.his} eyes were wide open.",
    ]), c, rng), fill(pick(rng, [
        "{A.He} [tossed and turned|rolled to one side and then the other|counted the stars on "
        "{A.his} ceiling].",
        "{A.He} heard a [creak|tap|whoosh] outside and pulled the blanket up to {A.his} nose.",
        "{A.His} mind was full of thoughts about the day.",
    ]), c, rng)]
    p2 = [say(rng, A, fill(pick(rng, ["{P}, I cannot sleep.", "{P}, will you stay with me?",
                                      "{P}! Are you still awake?"]), c, rng)),
          fill(pick(rng, ["{P} came in and sat on the bed.", "{P} came in with a soft smile.",
                          "{P} opened the door quietly."]), c, rng),
          fill(pick(rng, ["{P.He} {HELP}.", "{P} {HELP}."]), c, rng)]
    p3 = [fill(pick(rng, [
        "{A.His} eyes began to feel heavy.", "{A} yawned a big yawn.",
        "Soon {A.his} breathing was slow and soft.",
    ]), c, rng), say(rng, P, fill(pick(rng, ["Good night, {A}. I love you.",
                                              "Sweet dreams, my little one.",
                                              "Sleep well. I will see you in the morning."]), c, rng))]
    p4 = [fill(pick(rng, [
        "That night, {A} dreamed of {DREAM}.", "{A} fell asleep and dreamed of {DREAM}.",
        "In {A.his} dream, there was {DREAM}.",
    ]), c, rng), fill(pick(rng, [
        "In the morning, {A} woke up [rested and happy|with a big smile|ready to play].",
        "{A} slept all night long.", "The house was quiet, and {A} slept until the sun came up.",
    ]), c, rng)]
    return [" ".join(p) for p in (p1, p2, p3, p4)]


def making(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    thing, steps, oops, result = rng.choice(L.MAKES)
    c.update(T=thing, ST1=steps[0], ST2=steps[1], ST3=steps[2], OOPS=oops, RES=result)
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A}} wanted to make {{T}}.",
        "{A} and {A.his} {P.rel} decided to make {T} together.",
        "{A} had a big idea. {A.He} {A.was} going to make {T}!",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "First, {A.he} {ST1}. Then {A.he} {ST2}. Last, {A.he} {ST3}.",
        "{A} {ST1} and {ST2}. Then {A.he} {ST3}.",
        "They {ST1}. Next they {ST2}. At the end, they {ST3}.",
    ]), c, rng)]
    p3 = [fill(pick(rng, ["But then, oh no! {OOPS}.", "Then something went wrong: {OOPS}.",
                          "Just when it was almost done, {OOPS}."]), c, rng),
          say(rng, A, pick(rng, ["It is ruined!", "I want to give up.", "Oh no! What do I do now?"]), mood="bad")]
    p3.append(say(rng, P, pick(rng, ["Mistakes happen. We can fix it.", "Let us try again. We learn by trying.",
                                     "Do not give up. Try one more time."])))
    p4 = [fill(pick(rng, ["So {A} tried again, slowly and carefully.", "{A} wiped {A.his} eyes and started again.",
                          "They tried again, and this time they went slowly."]), c, rng),
          fill(pick(rng, ["In the end, {RES}.", "This time it worked. {RES}.", "At last, {RES}."]), c, rng),
          ending(rng, c, ["{A} learned that mistakes help us learn.", "{A} learned to never give up.",
                          "Trying again made it even better.",
                          "{A} was proud because {A.he} did not give up."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def learning(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    skill, tri, fail, win = rng.choice(L.SKILLS)
    c.update(SK=skill, TRY=tri, FAIL=fail, WIN=win)
    p1 = [opening(rng, c), fill(pick(rng, [
        "{A} wanted to learn to {SK}.", "All of {A.his} friends could {SK}, but {A} could not.",
        "{A.His} {P.rel} said, \"Today you can learn to {SK}.\"",
    ]), c, rng)]
    p2 = [fill(pick(rng, ["{A} {TRY}. But {FAIL}.", "First, {A} {TRY}. Oh no, {FAIL}.",
                          "{A.He} tried hard. {A.He} {TRY}, but {FAIL}."]), c, rng),
          say(rng, A, pick(rng, ["I cannot do it!", "This is too hard.", "I will never learn."]), mood="bad")]
    p3 = [say(rng, P, pick(rng, ["Everyone starts as a beginner. Try again.",
                                 "You are getting better every time.",
                                 "Do not give up. I believe in you."])),
          fill(pick(rng, ["{A} tried again and again.", "So {A} practiced every day.",
                          "{A} took a deep breath and tried once more."]), c, rng)]
    p4 = [fill(pick(rng, ["Then one day, {A} {WIN}!", "At last, {A} {WIN}!", "And this time, {A} {WIN}!"]),
               c, rng),
          say(rng, A, pick(rng, ["I did it!", "Look at me! I can do it!", "I knew I could!"])),
          ending(rng, c, ["{A} learned that practice makes things easier.",
                          "{A} learned that if you keep trying, you get better.",
                          "{A} learned to never give up.",
                          "Now {A} likes to help other kids learn to {SK}."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def garden(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    seed, becomes = rng.choice(L.SEEDS)
    c.update(SEED=seed, BEC=becomes)
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A.his}} {{P.rel}} gave {{A.him}} {{SEED}}.",
        "{A} found {SEED} in a little bag.",
    ]), c, rng), fill(pick(rng, [
        "{A} dug a small hole in the soil and put the seed inside.",
        "{A.He} planted it in a pot by the window.",
        "{A} and {P} planted it in the garden.",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "Every day, {A} gave it water. But nothing happened.",
        "{A} watched the dirt every morning. Nothing grew.",
        "{A} waited one day, then two days, then three. Still nothing.",
    ]), c, rng), say(rng, A, pick(rng, ["Why is it not growing?", "Is the seed broken?",
                                        "How long do I have to wait?"])),
        say(rng, P, pick(rng, ["Plants need time. Be patient.", "Keep giving it water and sun. It will grow.",
                               "Good things take time."]))]
    p3 = [fill(pick(rng, [
        "Then one morning, {A} saw a tiny green sprout!", "One day, a little green leaf poked out of the soil.",
        "After many days, {A} saw something small and green.",
    ]), c, rng), fill(pick(rng, [
        "{A} kept watering it. It grew and grew.", "Day by day, it grew taller.",
        "{A} gave it water and sang to it every day.",
    ]), c, rng)]
    p4 = [fill(pick(rng, ["At last it became {BEC}.", "By the end of the summer, it was {BEC}."]), c, rng),
          ending(rng, c, ["{A} learned that good things take time.", "{A} learned to be patient.",
                          "Waiting was hard, but it was worth it."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def honesty(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    thing, owner, how = rng.choice(L.BREAKABLES)
    c.update(BR=thing, OWN=owner, X=f"{owner} {thing}", HOW=how)
    p1 = [opening(rng, c), fill(
        f"{time_phrase(rng)}, {{A}} was playing in the house. {{A.He}} {{HOW}}.",
        c, rng), fill(pick(rng, ["Crash! The {BR} broke into pieces.", "The {BR} cracked in two.",
                                 "There was a loud crack."]), c, rng)]
    p2 = [fill(pick(rng, [
        "{A} was scared. {A.He} hid the pieces under the [sofa|rug|bed].",
        "{A} thought, \"Maybe nobody will know.\"",
        "{A.His} heart beat fast. {A.He} wanted to run and hide.",
    ]), c, rng), fill(pick(rng, [
        "Later, {P} asked, \"Does anyone know what happened to the {BR}?\"",
        "Soon {P} came in and looked around. \"Where is the {BR}?\" {P.he} asked.",
    ]), c, rng)]
    p3 = [fill(pick(rng, [
        "{A} did not want to tell. But {A.he} knew lying was wrong.",
        "{A} looked at {A.his} feet. Then {A.he} took a deep breath.",
    ]), c, rng), say(rng, A, fill(pick(rng, [
        "It was me. I broke it. I am sorry.", "I did it, {P}. It was an accident. I am very sorry.",
    ]), c, rng))]
    p4 = [fill(pick(rng, [
        "{P} hugged {A}. \"Thank you for telling the truth,\" {P.he} said. \"That was brave.\"",
        "{P} was not angry. \"Things can be fixed,\" {P.he} said. \"I am glad you told me.\"",
    ]), c, rng), fill(pick(rng, [
        "Together they glued the {BR} back together.", "Then they cleaned up the pieces together.",
    ]), c, rng), ending(rng, c, ["{A} learned that telling the truth is always best.",
                                 "{A} learned that being honest makes you feel lighter inside.",
                                 "From then on, {A} always told the truth."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def birthday(rng: random.Random, c: dict) -> list[str]:
    A, P, B = c["A"], c["P"], c["B"]
    c.update(AGE=rng.choice(["five", "six", "seven", "eight"]), GIFT=make_thing(rng, L.TOYS).a)
    p1 = [opening(rng, c), fill(pick(rng, [
        "Today was {A.his} birthday! {A} jumped out of bed.",
        "{A} woke up with a big smile. It was {A.his} birthday, and {A.he} {A.was} {AGE} today.",
        "It was a special day. {A} was turning {AGE}!",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "But nobody said happy birthday. {P} was busy, and {B} did not call.",
        "But at breakfast, nobody said a word about it. {P} just read the paper.",
        "{A} waited and waited, but nobody said anything about {A.his} birthday.",
    ]), c, rng), fill(pick(rng, [
        "{A} felt {F}. \"Did everyone forget?\" {A.he} thought.",
        "{A.His} smile went away. {A.He} felt {F}.",
    ]), {**c, "F": feeling(rng, False)}, rng)]
    p3 = [fill(pick(rng, [
        "In the afternoon, {P} said, \"Can you help me get something from the [garden|yard|kitchen]?\"",
        "Later, {P} asked {A} to come to the [living room|garden|backyard].",
    ]), c, rng), fill(pick(rng, [
        "When {A} opened the door, everyone jumped out. \"Surprise!\" they shouted.",
        "\"Surprise!\" shouted {B} and all of {A.his} friends. There were balloons everywhere.",
    ]), c, rng), fill(pick(rng, [
        "There was a big cake with {AGE} candles. {A} made a wish and blew them all out.",
        "{P} brought out a [chocolate|strawberry|lemon] cake. Everyone sang a song for {A}.",
    ]), c, rng)]
    p4 = [fill(pick(rng, [
        "{B} gave {A} {GIFT}. It was just what {A.he} wanted.",
        "{A.His} present was {GIFT}. {A.He} hugged it [tight|and laughed].",
    ]), c, rng), say(rng, A, pick(rng, ["This is the best birthday ever!", "Thank you, everyone!",
                                        "I thought you forgot!"])),
        ending(rng, c, ["{A} learned that the people who love you never really forget.",
                        "It was the happiest birthday {A} ever had.",
                        "{A} knew {A.he} had the best family and friends in the world."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def pet_care(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    pet, food, place = rng.choice([("puppy", "dog food", "a soft bed"), ("kitten", "milk and fish", "a basket"),
                                   ("bunny", "carrots and hay", "a hutch"), ("goldfish", "fish flakes", "a bowl"),
                                   ("hamster", "seeds", "a little cage"), ("parrot", "seeds and fruit", "a cage")])
    name = rng.choice(["Pepper", "Noodle", "Bean", "Sunny", "Pickles", "Mochi", "Biscuit", "Button", "Ziggy",
                       "Cookie", "Maple", "Pip"])
    c.update(PET=pet, PN=name, FOOD=food, HOME=place)
    p1 = [opening(rng, c), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A.his}} {{P.rel}} came home with a box. Inside was a little {{PET}}!",
        "For a long time, {A} had wanted a pet. Then one day, {P} said yes, and they got a {PET}.",
    ]), c, rng), fill(pick(rng, [
        "{A} named it {PN}.", "\"I will call you {PN},\" said {A}.", "They called the {PET} {PN}."
    ]), c, rng)]
    p2 = [say(rng, P, pick(rng, ["A pet is a big job. You must take care of it every day.",
                                 "Pets need food, water and lots of love.",
                                 "If you want a pet, you have to look after it."])),
          fill(pick(rng, [
              "Every day, {A} gave {PN} {FOOD} and fresh water.",
              "{A} fed {PN} every morning and made {HOME} for it to sleep in.",
          ]), c, rng)]
    p3 = [fill(pick(rng, [
        "But one day, {A} wanted to play with {A.his} friends. {A.He} forgot to feed {PN}.",
        "One busy day, {A} was so excited about a game that {A.he} forgot about {PN}.",
    ]), c, rng), fill(pick(rng, [
        "That night, {PN} looked hungry and sad.", "In the evening, {PN} sat very still in the corner.",
    ]), c, rng), fill(pick(rng, [
        "{A} felt bad. {A.He} gave {PN} food right away and said sorry.",
        "{A} ran to get {FOOD}. \"I am sorry, {PN},\" {A.he} said softly.",
    ]), c, rng)]
    p4 = [fill(pick(rng, [
        "From then on, {A} never forgot. {PN} grew big and happy.",
        "After that, {A} made a chart to remember to feed {PN} every day.",
    ]), c, rng), ending(rng, c, ["{A} learned that taking care of a pet means every day, not just some days.",
                                 "{A} and {PN} were best friends.",
                                 "{A} learned that when someone depends on you, you must not forget them."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def race(rng: random.Random, c: dict) -> list[str]:
    A, B = c["A"], c["B"]
    game = rng.choice(["a race to the big tree", "a race across the field", "a game of tag",
                       "a jumping contest", "a game of catch", "a hopping race"])
    c.update(GAME=game)
    p1 = [opening(rng, c), fill(
        f"{time_phrase(rng)}, {{A}} and {{B}} were playing {c['L']['at']}.", c, rng), *scenery(rng, c, 0.5),
        fill(pick(rng, ["{B} said, \"Let us have {GAME}!\"", "They decided to have {GAME}."]), c, rng)]
    p2 = [fill(pick(rng, [
        "{A} wanted to win very much. {A.He} [ran|went] as fast as {A.he} could.",
        "\"I will win!\" said {A}. {A.He} started very fast.",
    ]), c, rng), fill(pick(rng, [
        "But {A} tripped on a [root|stone|shoe lace] and fell down. {B} won.",
        "But {B} was faster. {B} won, and {A} came second.",
        "It was close, but {B} won.",
    ]), c, rng)]
    p3 = [fill(pick(rng, [
        "{A} felt angry. {A.He} [kicked a stone|stomped {A.his} feet|folded {A.his} arms].",
        "{A}'s face went red. {A.He} did not want to play anymore.",
    ]), c, rng), say(rng, A, pick(rng, ["That is not fair! I want to win!", "I do not like this game.",
                                        "I never win anything."]), mood="bad"),
        fill(pick(rng, [
            "{B} came over and held out {B.his} hand. \"You were really fast,\" {B.he} said. \"Good game.\"",
            "{B} sat down next to {A}. \"It was just a game,\" {B.he} said. \"I had fun with you.\"",
        ]), c, rng)]
    p4 = [fill(pick(rng, [
        "{A} thought about it. Then {A.he} smiled and shook {B}'s hand.",
        "{A} took a deep breath. \"Good game, {B},\" {A.he} said. \"Can we play again?\"",
    ]), c, rng), fill(pick(rng, [
        "They played again and again. Sometimes {A} won, and sometimes {B} won.",
        "They played until it was time for dinner, and they laughed the whole time.",
    ]), c, rng), ending(rng, c, ["{A} learned that having fun is more important than winning.",
                                 "{A} learned to be a good sport.",
                                 "Winning is nice, but playing with a friend is even better."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def tidy_up(rng: random.Random, c: dict) -> list[str]:
    A, P, O = c["A"], c["P"], c["O"]
    p1 = [opening(rng, c), fill(pick(rng, [
        "{A.His} room was very messy. There were toys and clothes all over the floor.",
        "{A} did not like to clean up. {A.His} room looked like a storm had passed through it.",
    ]), c, rng), fill(pick(rng, [
        f"{time_phrase(rng)}, {{A}} wanted to play with {{A.his}} {{O.full}}, but {{A.he}} could not find it.",
        "{A} looked everywhere for {A.his} {O}, but there was too much mess.",
    ]), c, rng)]
    p2 = [say(rng, P, pick(rng, ["If you clean your room, you might find it.",
                                 "A tidy room is a happy room. Let us clean up.",
                                 "It is time to put things where they belong."])),
          say(rng, A, pick(rng, ["But cleaning is boring!", "It will take forever!", "Do I have to?"]), mood="bad")]
    p3 = [fill(pick(rng, [
        "{P} had an idea. \"Let us make it a game. Who can pick up the most toys before the song ends?\"",
        "{P} smiled. \"We can race. You do the blocks, and I will do the books.\"",
    ]), c, rng), fill(pick(rng, [
        "{A} put the blocks in the box and the books on the shelf. {A.He} folded {A.his} shirts.",
        "{A} picked up socks, cars and crayons. {A.He} worked faster and faster.",
    ]), c, rng), fill(pick(rng, [
        "Under a pile of clothes, {A} found the {O}!",
        "At the very bottom of the toy box, there was the {O}!",
    ]), c, rng)]
    p4 = [say(rng, A, pick(rng, ["Cleaning was fun!", "My room looks so nice now!",
                                 "I found it! I am glad we cleaned."])),
          ending(rng, c, ["{A} learned that a tidy room makes things easy to find.",
                          "From then on, {A} put {A.his} toys away every night.",
                          "{A} learned that even chores can be fun."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def lost_way(rng: random.Random, c: dict) -> list[str]:
    A, P, B, Pl = c["A"], c["P"], c["B"], c["L"]
    s1, s2 = rng.sample(Pl["see"], 2)
    c.update(SEE1=s1, SEE2=s2)
    p1 = [opening(rng, c), fill(
        f"{time_phrase(rng)}, {{A}} and {{A.his}} {{P.rel}} went {Pl['to']}.", c, rng), fill(pick(rng, [
        "{A} saw a [pretty butterfly|shiny beetle|little yellow bird|big red leaf] and followed it.",
        "{A} wanted to see {SEE1} up close, so {A.he} ran ahead.",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "When {A} turned around, {P} was not there.",
        "After a while, {A} looked back. {A.He} could not see {P} anywhere.",
    ]), c, rng), fill(pick(rng, [
        "Everything looked big and strange. {A} felt very {F}.",
        "{A.His} tummy felt tight. {A.He} {A.was} lost!",
    ]), {**c, "F": feeling(rng, False)}, rng),
        say(rng, A, fill("[{P}! Where are you?|Help! I am lost!|{P}, can you hear me?]", c, rng),
            verb="called", mood="bad")]
    p3 = [fill(pick(rng, [
        "Then {A} remembered what {P} always said: \"If you get lost, stay where you are.\" So {A} sat down and waited.",
        "{A} took a deep breath. {A.He} remembered passing {SEE2}, so {A.he} walked back that way.",
        "{B} came by and saw that {A} was alone. \"Are you lost?\" {B.he} asked. \"I will help you look.\"",
    ]), c, rng), fill(pick(rng, [
        "Soon {A} heard a voice calling {A.his} name. It was {P}!",
        "And there, [by the gate|near the path|under a big tree], was {P}, looking for {A}.",
    ]), c, rng)]
    p4 = [fill(pick(rng, [
        "{A} ran to {P} and hugged {P.him} tight.", "{P} scooped {A} up in a big hug.",
    ]), c, rng), say(rng, P, pick(rng, ["I was so worried. I am glad you are safe.",
                                        "Next time, stay close to me, okay?",
                                        "You did the right thing to stay calm."])),
        ending(rng, c, ["{A} learned to always stay close when {A.he} {A.was} in a new place.",
                        "{A} promised to never run off again.",
                        "{A} learned that staying calm helps when you are lost."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def sick_day(rng: random.Random, c: dict) -> list[str]:
    A, P, B = c["A"], c["P"], c["B"]
    missed = rng.choice(["the school play", "the class trip to the farm", "a birthday party",
                         "the big soccer game", "the picnic in the park"])
    c.update(MISS=missed)
    p1 = [opening(rng, c), fill(pick(rng, [
        "One morning, {A} woke up with a [sore throat|runny nose|hot head|cough]. {A.He} felt very tired.",
        "{A} did not feel well. {A.His} head hurt, and {A.his} nose was red.",
    ]), c, rng), fill(pick(rng, [
        "{P} touched {A.his} head. \"You are too sick to go out today,\" {P.he} said.",
        "{P} said {A} had to stay in bed all day.",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "But today was {MISS}! {A} had waited for it for weeks.",
        "{A} was sad. {A.He} would miss {MISS}.",
    ]), c, rng), say(rng, A, pick(rng, ["It is not fair! I want to go!", "Now I will miss all the fun.",
                                        "Why do I have to be sick today?"]), mood="bad")]
    p3 = [fill(pick(rng, [
        "{P} made {A} a bowl of warm soup and sat with {A.him}.",
        "{P} brought {A} warm tea with honey and read {A.him} a story.",
    ]), c, rng), fill(pick(rng, [
        "In the afternoon, there was a knock at the door. It was {B}! {B.He} had made {A} a card.",
        "Later, {B} came to the window and waved. {B.He} held up a picture {B.he} had drawn for {A}.",
    ]), c, rng), say(rng, B, fill("[Get well soon, {A}!|We missed you today!|I saved you a sticker!]", c, rng))]
    p4 = [fill(pick(rng, [
        "{A} smiled for the first time that day.", "{A} felt a little better already.",
    ]), c, rng), fill(pick(rng, [
        "After two days of rest, {A} was well again.", "Soon {A} was healthy and ready to play.",
    ]), c, rng), ending(rng, c, ["{A} learned that friends make even a sick day better.",
                                 "{A} learned that resting helps you get well.",
                                 "{A} kept the card from {B} on {A.his} wall."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def gift(rng: random.Random, c: dict) -> list[str]:
    A, P = c["A"], c["P"]
    made = rng.choice([("drew a picture of the two of them under a rainbow", "picture"),
                       ("made a necklace out of pasta and string", "necklace"),
                       ("picked a bunch of wild flowers and tied them with a ribbon", "flowers"),
                       ("wrote a poem with big, careful letters", "poem"),
                       ("painted a stone to look like a ladybug", "stone"),
                       ("baked little cookies with help from a neighbor", "cookies")])
    c.update(MADE=made[0], GIFTN=made[1])
    p1 = [opening(rng, c), fill(pick(rng, [
        "Tomorrow was {P}'s birthday. {A} wanted to give {P.him} a present.",
        "{A} wanted to say thank you to {A.his} {P.rel} for being so kind.",
    ]), c, rng), fill(pick(rng, [
        "But {A} had no money. {A.He} looked in {A.his} piggy bank and found only one coin.",
        "{A} went to the shop window and looked at the nice things. They all cost too much.",
    ]), c, rng)]
    p2 = [fill(pick(rng, [
        "{A} sat on the steps and thought hard.", "{A} felt {F}. What could {A.he} give?",
    ]), {**c, "F": feeling(rng, False)}, rng), fill(pick(rng, [
        "Then {A} had an idea! {A.He} {MADE}.",
        "Then {A} smiled. {A.He} knew what to do. {A.He} {MADE}.",
    ]), c, rng), fill(pick(rng, [
        "It took a long time, but {A} did not give up.", "{A.He} worked on it until it was just right.",
    ]), c, rng)]
    p3 = [fill(pick(rng, [
        "The next morning, {A} gave {P} the present.",
        "{A} hid the present behind {A.his} back. \"Close your eyes,\" {A.he} said to {P}.",
    ]), c, rng), fill(pick(rng, [
        "When {P} saw it, {P.his} eyes filled with happy tears.",
        "{P} held it close and smiled a very big smile.",
    ]), c, rng), say(rng, P, pick(rng, ["This is the best present I have ever had!",
                                        "You made this yourself? I love it!",
                                        "I will keep it forever."]))]
    p4 = [ending(rng, c, ["{A} learned that the best presents come from the heart.",
                          "{A} learned that a gift made with love is worth more than money.",
                          "Every time {P} looked at the {GIFTN}, {P.he} smiled."])]
    return [tidy_join(p) for p in (p1, p2, p3, p4)]


def tidy_join(parts: list[str]) -> str:
    return " ".join(parts)


SHAPES = [lost_thing, sharing, new_friend, fear_overcome, weather, trip, helping_hand, bedtime,
          making, learning, garden, honesty, birthday, pet_care, race, tidy_up, lost_way, sick_day, gift]


# --------------------------------------------------------------------------- a whole story
def make_cast(rng: random.Random, shape) -> dict:
    animal_ok = shape in (lost_thing, sharing, new_friend, helping_hand, bedtime, fear_overcome, garden, race,
                         lost_way, sick_day)
    animals = animal_ok and rng.random() < 0.3
    fits = ("animal", "any") if animals else ("kid", "any")
    place = rng.choice([p for p in L.PLACES if p["fits"] in fits])
    A = make_animal(rng) if animals else make_kid(rng)
    B = make_animal(rng, exclude=(A.name,)) if animals else make_kid(rng, exclude=(A.name,))
    return dict(A=A, B=B, P=make_parent(rng), O=make_thing(rng, L.TOYS), L=place)


def story(rng: random.Random) -> str:
    """One story of MIN_WORDS..MAX_WORDS words (retries with the same rng until it fits)."""
    while True:
        shape = rng.choice(SHAPES)
        c = make_cast(rng, shape)
        c["AWAY"] = shape in (lost_thing, sharing, new_friend, helping_hand, race) and c["L"]["name"] != "the house"
        text = tidy("\n".join(shape(rng, c)))
        n = len(text.split())
        if MIN_WORDS <= n <= MAX_WORDS:
            return text


def generate(n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> str:
    """The whole corpus as one string: stories separated by EOT lines, ending in a newline."""
    rng = random.Random(seed)
    return f"\n{EOT}\n".join(story(rng) for _ in range(n)) + "\n"


def stats(text: str) -> dict:
    stories = [s.strip() for s in text.split(EOT) if s.strip()]
    words = text.replace(EOT, " ").split()
    sents = re.findall(r"[^.!?\n]+[.!?]", text.replace(EOT, ""))
    return dict(bytes=len(text.encode("utf-8")), stories=len(stories), words=len(words),
                distinct_words=len(set(w.strip('.,!?"').lower() for w in words)),
                sentences=len(sents), distinct_sentences=len(set(s.strip() for s in sents)),
                mean_words=round(len(words) / max(1, len(stories)), 1),
                sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=DEFAULT_N, help="number of stories")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if --out differs")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    text = generate(args.n, args.seed)
    dt = time.perf_counter() - t0
    if args.check:
        same = args.out.exists() and args.out.read_bytes() == text.encode("utf-8")
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from the generator output'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(text.encode("utf-8"))
    tmp.replace(args.out)
    s = stats(text)
    print(f"wrote {args.out} in {dt:.2f}s")
    for k, v in s.items():
        print(f"  {k:19s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
