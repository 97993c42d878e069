"""Word material for scripts/make_corpus.py, written for this project.

Plain Python lists and dicts (no randomness here). The story shapes in make_corpus.py
pick from them. Keep every entry singular and in simple words a young reader knows.
Avoid nouns that start with a "yu" sound (unicorn, uniform): the a/an rule in
make_corpus.py looks at the first letter only.
"""

BOYS = [
    "Tom", "Ben", "Max", "Leo", "Sam", "Jack", "Finn", "Omar", "Ravi", "Kenji", "Theo",
    "Noah", "Eli", "Hugo", "Milo", "Oscar", "Luca", "Jonah", "Arlo", "Felix", "Amir",
    "Diego", "Kofi", "Tariq", "Ivan", "Pablo", "Owen", "Jake", "Timmy", "Danny", "Liam",
    "Ethan", "Ali", "Mateo", "Yusuf", "Bruno", "Carlos", "Dev", "Hiro", "Joe",
]
GIRLS = [
    "Lily", "Mia", "Anna", "Sue", "Emma", "Zoe", "Ella", "Rosa", "Priya", "Aisha",
    "Nora", "Ivy", "Maya", "Lucy", "Chloe", "Hana", "Grace", "Ruby", "Leila", "Fatima",
    "Sofia", "Amara", "Jade", "Elsie", "Wren", "Mei", "Sara", "Tessa", "Kim", "Molly",
    "Daisy", "Layla", "Nina", "Olivia", "Amy", "Bella", "Clara", "Esme", "Yara", "Lena",
]
# Children who go by "they".
THEY_KIDS = ["Alex", "Robin", "Quinn", "Rowan", "Kit", "Jordan", "Sky", "River"]

# (species, names, pronoun) — animal characters.
ANIMALS = [
    ("dog", ["Spot", "Buddy", "Rex", "Biscuit", "Scout"], "he"),
    ("puppy", ["Pip", "Coco", "Patch", "Bingo"], "she"),
    ("cat", ["Tibby", "Mittens", "Luna", "Socks", "Ginger"], "she"),
    ("kitten", ["Fluff", "Whiskers", "Tiger", "Pebble"], "he"),
    ("bunny", ["Hop", "Clover", "Thumper", "Daisy"], "she"),
    ("bear", ["Bruno", "Honey", "Teddy", "Barney"], "he"),
    ("fox", ["Rusty", "Flame", "Red", "Ziggy"], "he"),
    ("owl", ["Hoot", "Ollie", "Wise", "Olive"], "she"),
    ("duck", ["Quack", "Puddle", "Dilly", "Waddles"], "he"),
    ("mouse", ["Squeak", "Nibbles", "Tiny", "Minnie"], "she"),
    ("frog", ["Hopper", "Fred", "Lily", "Ribbit"], "he"),
    ("turtle", ["Shelly", "Tuck", "Slowpoke", "Myrtle"], "she"),
    ("squirrel", ["Nutty", "Chip", "Acorn", "Zippy"], "he"),
    ("pig", ["Pinky", "Oink", "Rosie", "Truffle"], "she"),
    ("lamb", ["Woolly", "Snowy", "Lulu", "Curly"], "she"),
    ("duckling", ["Peep", "Sunny", "Dot", "Splash"], "he"),
    ("hedgehog", ["Prickles", "Spike", "Hazel", "Bramble"], "she"),
    ("elephant", ["Ellie", "Jumbo", "Peanut", "Trunk"], "he"),
    ("monkey", ["Cheeky", "Bongo", "Mango", "Zip"], "he"),
    ("goat", ["Billy", "Nanny", "Gruff", "Button"], "she"),
    ("bird", ["Tweet", "Robin", "Chirpy", "Feather"], "she"),
    ("deer", ["Bambi", "Fawn", "Dapple", "Star"], "he"),
]

# Grown-ups a child lives with: (name used in the story, word after "his/her").
PARENTS = [("Mom", "mom"), ("Dad", "dad"), ("Grandma", "grandma"), ("Grandpa", "grandpa"),
           ("Mama", "mama"), ("Papa", "papa")]
PARENT_PRONOUN = {"Mom": "she", "Dad": "he", "Grandma": "she", "Grandpa": "he",
                  "Mama": "she", "Papa": "he"}
# Other grown-ups: (name, pronoun, who they are).
HELPERS = [
    ("Mrs. Green", "she", "the teacher"), ("Mr. Brown", "he", "the baker"),
    ("Aunt Rose", "she", "the aunt"), ("Uncle Sam", "he", "the uncle"),
    ("Mr. Lee", "he", "the neighbor"), ("Mrs. Patel", "she", "the neighbor"),
    ("Miss Hill", "she", "the teacher"), ("Mr. Jones", "he", "the farmer"),
    ("Old Mr. Oak", "he", "the gardener"), ("Mrs. Kim", "she", "the librarian"),
]

COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "brown",
          "gold", "silver", "striped", "spotty"]

# Objects a character can own, lose or share: (noun, adjectives that fit it).
TOYS = [
    ("ball", ["red", "blue", "bouncy", "big", "yellow", "striped"]),
    ("kite", ["red", "green", "long-tailed", "bright", "orange"]),
    ("teddy bear", ["soft", "brown", "old", "fluffy", "little"]),
    ("toy car", ["red", "fast", "shiny", "little", "blue"]),
    ("doll", ["pretty", "little", "old", "rag"]),
    ("toy boat", ["little", "wooden", "blue", "white"]),
    ("toy robot", ["shiny", "silver", "noisy", "little"]),
    ("hat", ["red", "funny", "warm", "big", "yellow"]),
    ("scarf", ["long", "warm", "striped", "purple"]),
    ("shiny stone", ["smooth", "little", "round"]),
    ("book", ["picture", "big", "old", "new"]),
    ("drum", ["little", "red", "loud"]),
    ("toy train", ["wooden", "green", "long"]),
    ("whistle", ["silver", "little", "loud"]),
    ("blanket", ["soft", "warm", "blue", "fuzzy"]),
    ("crayon", ["purple", "green", "orange", "blue"]),
    ("bucket", ["red", "little", "yellow"]),
    ("jump rope", ["pink", "long", "green"]),
    ("stuffed bunny", ["soft", "white", "floppy"]),
    ("bell", ["little", "gold", "silver"]),
    ("marble", ["blue", "glass", "shiny", "green"]),
    ("puzzle", ["big", "new", "animal"]),
    ("yo-yo", ["red", "orange", "glowing"]),
    ("ribbon", ["pink", "long", "silk", "red"]),
]
FOODS = [
    ("apple", ["red", "big", "juicy", "green"]),
    ("cookie", ["big", "warm", "chocolate", "sweet"]),
    ("banana", ["yellow", "ripe", "long"]),
    ("orange", ["big", "sweet", "juicy"]),
    ("sandwich", ["cheese", "big", "tasty"]),
    ("cupcake", ["pink", "sweet", "little"]),
    ("muffin", ["warm", "blueberry", "soft"]),
    ("pear", ["green", "juicy", "sweet"]),
    ("piece of cake", ["big", "sweet", "chocolate"]),
    ("bowl of berries", ["big", "little", "fresh"]),
    ("carrot", ["crunchy", "orange", "long"]),
    ("slice of bread", ["warm", "fresh", "soft"]),
]

# Places: name, "at/in" phrase, who fits ("kid", "animal" or "any"), hiding spots,
# things to see and ways to play.
PLACES = [
    dict(name="the park", at="at the park", fits="kid",
         spots=["under the slide", "behind the big oak tree", "near the swings",
                "in the sandbox", "under a bench"],
         see=["the swings", "a big slide", "ducks on the pond", "tall trees", "a dog with a stick"],
         play=["played on the swings", "went down the slide", "ran on the grass",
               "played tag", "climbed the little wall"]),
    dict(name="the garden", at="in the garden", fits="any",
         spots=["under a big leaf", "behind the flower pots", "by the watering can",
                "in the tall grass", "under the rose bush"],
         see=["red roses", "a busy bee", "a long worm", "yellow flowers", "a butterfly"],
         play=["watered the flowers", "looked for bugs", "dug in the dirt",
               "chased butterflies", "picked a flower"]),
    dict(name="the beach", at="at the beach", fits="any",
         spots=["in the sand", "behind a big rock", "near the water", "under a towel",
                "by a pile of shells"],
         see=["big waves", "white birds", "pretty shells", "a little crab", "a boat far away"],
         play=["built a sandcastle", "jumped over the waves", "collected shells",
               "dug a big hole", "ran along the water"]),
    dict(name="the backyard", at="in the backyard", fits="kid",
         spots=["behind the shed", "under the table", "in the flower bed", "by the fence",
                "under the big tree"],
         see=["a bird on the fence", "the clothes on the line", "a big tree", "a little swing"],
         play=["played catch", "swung on the swing", "blew bubbles", "played hide and seek",
               "drew with chalk"]),
    dict(name="the playground", at="at the playground", fits="kid",
         spots=["under the slide", "by the seesaw", "near the gate", "in the sand",
                "behind the climbing frame"],
         see=["a red slide", "a seesaw", "kids on the swings", "a tall climbing frame"],
         play=["went on the seesaw", "climbed the frame", "slid down the slide",
               "played tag", "spun on the roundabout"]),
    dict(name="the forest", at="in the forest", fits="animal",
         spots=["under a log", "behind a big tree", "in a pile of leaves", "near a mossy rock",
                "by the little stream"],
         see=["tall trees", "red mushrooms", "a little stream", "birds in the branches",
              "soft green moss"],
         play=["jumped in the leaves", "ran between the trees", "played hide and seek",
               "looked for berries", "climbed over logs"]),
    dict(name="the farm", at="on the farm", fits="any",
         spots=["in the hay", "behind the barn", "by the water trough", "under the cart",
                "near the chicken coop"],
         see=["a big red barn", "cows in the field", "hens and chicks", "a tractor",
              "a muddy pig"],
         play=["fed the hens", "jumped in the hay", "ran in the field", "helped with the eggs",
               "watched the cows"]),
    dict(name="the pond", at="by the pond", fits="animal",
         spots=["under a lily pad", "in the reeds", "behind a rock", "near the old log",
                "in the mud"],
         see=["green lily pads", "little fish", "a dragonfly", "tall reeds", "a family of ducks"],
         play=["splashed in the water", "hopped on the rocks", "watched the fish",
               "swam in circles", "played by the reeds"]),
    dict(name="the meadow", at="in the meadow", fits="animal",
         spots=["in the tall grass", "under a daisy", "behind a hill", "near a flat stone",
                "by the old fence"],
         see=["many flowers", "a bright blue sky", "a busy bee", "a soft breeze in the grass"],
         play=["rolled down the hill", "chased a butterfly", "ran in the grass",
               "played in the sun", "picked flowers"]),
    dict(name="school", at="at school", fits="kid",
         spots=["under a desk", "in the book corner", "by the coat hooks", "in the toy box",
                "behind the teacher's chair"],
         see=["a big map", "bright pictures on the wall", "a fish tank", "a box of crayons"],
         play=["painted a picture", "sang a song", "read a book", "built a tower of blocks",
               "played a game"]),
    dict(name="the house", at="at home", fits="kid",
         spots=["under the bed", "behind the sofa", "in the toy box", "under a pillow",
                "by the front door"],
         see=["a cozy sofa", "a big window", "the kitchen table", "a shelf of books"],
         play=["built a fort with pillows", "played with blocks", "drew pictures",
               "played a board game", "had a tea party"]),
]

# Where a family can go on a trip: (name, what they see there, a small event there).
TRIPS = [
    ("the zoo", ["a tall giraffe", "a sleepy lion", "funny monkeys", "a big gray elephant",
                 "penguins in the water", "a striped zebra"],
     ["a monkey waved at them", "a penguin slid into the water with a splash",
      "the giraffe ate leaves from the top of a tree"]),
    ("the beach", ["big blue waves", "white birds", "a crab in the sand", "a red boat",
                   "shells of every color"],
     ["a wave ran up and tickled their feet", "a bird flew down and looked at their lunch",
      "they found a shell shaped like a star"]),
    ("the farm", ["cows in a green field", "a pink pig in the mud", "a proud rooster",
                  "a baby goat", "a big tractor"],
     ["the baby goat tried to eat a hat", "the rooster crowed very loudly",
      "they got to hold a fluffy chick"]),
    ("the lake", ["ducks on the water", "a wooden dock", "tall green trees", "little fish",
                  "a boat with a white sail"],
     ["a fish jumped out of the water", "a duck swam right up to them",
      "they skipped stones on the water"]),
    ("the mountains", ["tall rocks", "a cold stream", "a snowy top", "a deer in the trees",
                       "tiny blue flowers"],
     ["they saw the whole valley from the top", "a deer watched them from the trees",
      "they drank water from a cold clear stream"]),
    ("the museum", ["old dinosaur bones", "a big shiny rocket", "paintings of the sea",
                    "a huge whale made of wood", "old coins"],
     ["the dinosaur was as tall as a house", "they pressed a button and lights flashed",
      "a guide told them a story about the stars"]),
    ("the city", ["tall buildings", "busy buses", "a big fountain", "a man playing music",
                  "a shop full of hats"],
     ["they rode a bus with two floors", "they threw a coin into the fountain",
      "they ate noodles at a small cafe"]),
    ("the aquarium", ["a shark", "bright orange fish", "a slow turtle", "a wiggly octopus",
                      "glowing jellyfish"],
     ["the octopus waved one of its arms", "a big turtle swam right past the glass",
      "they touched a starfish in a little pool"]),
]

FEELINGS_GOOD = ["happy", "glad", "proud", "excited", "pleased", "cheerful"]
FEELINGS_SAD = ["sad", "upset", "unhappy", "worried", "gloomy"]

# Fears for the "fear overcome" shape: (thing, a line that names the fear, the brave act,
# what happened after).
FEARS = [
    ("the dark", "I do not like the dark. It is too black.",
     "turned off the light and lay very still",
     "the room was quiet and the moon made a soft light on the wall"),
    ("the big slide", "The slide is too tall. I might fall.",
     "climbed the ladder one step at a time and sat at the top",
     "it was fast and fun, and the wind blew in {his} hair"),
    ("the water", "The water is too deep. I am scared to swim.",
     "held on and kicked {his} legs in the water",
     "the water held {him} up, and it felt cool and nice"),
    ("thunder", "The thunder is so loud. It hurts my ears.",
     "counted the seconds between the light and the boom",
     "the storm moved far away, and the booms got quiet"),
    ("the big dog next door", "The big dog barks so loud. I think it will bite.",
     "held out a hand slowly and let the dog sniff it",
     "the dog wagged its tail and licked {his} fingers"),
    ("climbing the tree", "The tree is so high. What if I get stuck?",
     "put one foot on the low branch and then the next",
     "{he} could see the whole street from up in the branches"),
    ("the first day of school", "I do not know anyone there. What if nobody talks to me?",
     "walked into the room and said hello to a girl with a red bag",
     "the girl smiled and showed {him} where to hang {his} coat"),
    ("riding the bike without help", "I will wobble and fall down.",
     "pushed the pedals and looked straight ahead",
     "the bike went straight and the wheels hummed on the path"),
]

# The fears that also fit an animal character.
ANIMAL_FEARS = ["the dark", "the water", "thunder", "climbing the tree", "the big dog next door"]

# Weather for the "weather" shape: (weather, how it starts, the plan it spoils, the new fun).
WEATHER = [
    ("rain", ["dark clouds came over the hill", "big drops began to fall",
              "the rain tapped on the window"],
     "play outside", ["built a fort out of blankets", "baked cookies in the warm kitchen",
                      "painted pictures of the rain", "put on boots and jumped in puddles"]),
    ("snow", ["white flakes fell from the sky", "the ground turned white",
              "snow covered the whole yard"],
     "go to the park", ["built a snowman with a carrot nose", "made angels in the snow",
                        "drank hot cocoa by the window", "rode a sled down the hill"]),
    ("wind", ["the wind began to blow hard", "the trees bent and swayed",
              "leaves flew all around"],
     "have a picnic", ["flew a kite high in the sky", "chased the flying leaves",
                       "watched the clouds race by", "made a paper windmill"]),
    ("fog", ["a thick gray fog rolled in", "the fog hid the trees",
             "everything looked soft and gray"],
     "go to the beach", ["played a guessing game inside", "told stories by the lamp",
                         "built a tall tower of blocks", "made soup with Grandma"]),
    ("heat", ["the sun was very hot", "the air felt heavy and warm",
              "the ground was too hot to walk on"],
     "play soccer", ["ran through the sprinkler", "ate cold ice pops in the shade",
                     "filled a little pool with water", "had a water fight"]),
]

# Problems for the "helping hand" shape: (problem seen, what the helper does, thanks line).
HELP_PROBLEMS = [
    ("a kite stuck high up in a tree", "found a long stick and gently poked the kite free",
     "My kite! Thank you so much!"),
    ("a bag of apples spilled all over the path", "picked up the apples one by one",
     "You are so kind. Thank you!"),
    ("a little bird with a hurt wing", "made a soft nest in a box and gave it water",
     "You took good care of the bird."),
    ("a puppy that could not find its way home", "read the tag on its collar and took it home",
     "Thank you for bringing my puppy back!"),
    ("a tower of blocks that had fallen down", "helped build it again, even taller",
     "It is better than before! Thank you!"),
    ("a heavy box that was too big to carry alone", "took one side of the box and lifted",
     "Thank you. It was much lighter with two."),
    ("a kitten that was stuck on a high wall", "ran to get a grown-up with a ladder",
     "You were smart to get help. Thank you!"),
    ("a ball that had rolled under the fence", "reached under the fence with a long arm",
     "My ball! You are the best!"),
    ("a garden full of weeds", "pulled the weeds until the flowers could see the sun",
     "My flowers can grow now. Thank you!"),
    ("a box of crayons spilled all over the path", "put every crayon back in the box",
     "Thank you for helping me clean up!"),
]

# Things to make for the "making" shape: (thing, steps, what goes wrong, how it ends).
MAKES = [
    ("a cake", ["mixed flour, eggs and sugar in a bowl", "poured the batter into a pan",
                "put the pan in the oven"],
     "the bowl slipped and some batter fell on the floor",
     "the cake came out warm and sweet"),
    ("a sandcastle", ["filled a bucket with wet sand", "made four tall towers",
                      "dug a moat all around it"],
     "a big wave came and washed one tower away", "the castle stood tall in the sun"),
    ("a birdhouse", ["cut the wood into pieces", "hammered the pieces together",
                     "painted the roof red"],
     "one wall fell off because the nail was too short", "a little bird came to look inside"),
    ("a card for {B}", ["folded a sheet of paper", "drew a big sun and a heart",
                            "wrote a kind note inside"],
     "the paint ran and made a big blot", "{B} smiled and put it on the wall"),
    ("cookies", ["stirred the butter and sugar", "rolled the dough into little balls",
                 "pressed a chocolate chip on top of each one"],
     "the first tray got a little too brown", "the next tray came out soft and golden"),
    ("a tower of blocks", ["put the big blocks at the bottom", "stacked the small ones on top",
                           "added a flag at the very top"],
     "the tower wobbled and fell with a crash", "the new tower stood taller than the chair"),
    ("a paper boat", ["folded the paper in half", "pulled the corners out",
                      "drew a little flag on the side"],
     "the first boat got wet and sank", "the boat floated all the way across the puddle"),
    ("a snowman", ["rolled a big ball of snow", "put a smaller ball on top",
                   "added two stones for eyes"],
     "the head rolled off and broke", "the snowman wore a warm scarf and a big smile"),
]

# Skills for the "learning" shape: (skill, how they try, how they fail, how they succeed).
SKILLS = [
    ("ride a bike", "got on the bike and pushed the pedals", "the bike wobbled and tipped over",
     "rode all the way to the end of the street"),
    ("tie shoes", "made two loops with the laces", "the loops came apart",
     "tied a neat bow all alone"),
    ("swim", "kicked and moved {his} arms in the water", "{he} sank and got water in {his} nose",
     "swam from one side of the pool to the other"),
    ("read a book", "looked at the letters and sounded them out", "the long words were too hard",
     "read a whole page out loud"),
    ("whistle", "put {his} lips together and blew", "only air came out",
     "made a clear, happy whistle"),
    ("jump rope", "swung the rope over {his} head and jumped", "the rope caught on {his} feet",
     "jumped ten times without stopping"),
    ("catch a ball", "held out {his} hands and watched the ball", "the ball bounced off {his} hands",
     "caught the ball three times in a row"),
    ("climb the rope", "grabbed the rope and pulled", "{his} hands slipped down",
     "climbed all the way to the top"),
]

# Plants for the "garden" shape: (seed, what it becomes).
SEEDS = [
    ("a sunflower seed", "a tall sunflower, taller than the fence"),
    ("a bean", "a green bean plant that climbed up a stick"),
    ("a tomato seed", "a plant with round red tomatoes"),
    ("a pumpkin seed", "a big orange pumpkin"),
    ("a tiny flower seed", "a bright pink flower"),
    ("an apple seed", "a little apple tree with shiny leaves"),
    ("a carrot seed", "a long orange carrot under the soil"),
    ("a pea", "a pod full of sweet green peas"),
]

# Things that can get broken in the "honesty" shape: (thing, owner word, how it breaks).
BREAKABLES = [
    ("vase", "Mom's", "knocked {X} off the table with a ball"),
    ("cup", "Grandma's favorite", "dropped {X} on the kitchen floor"),
    ("lamp", "the", "bumped into {X} while running"),
    ("plate", "the big", "slipped while carrying {X} and it fell"),
    ("flower pot", "Dad's", "kicked {X} by mistake"),
    ("toy plane", "{his} brother's", "threw {X} too hard at the wall"),
    ("picture frame", "the", "knocked {X} down with a pillow"),
]

# Dreams for the bedtime shape.
DREAMS = [
    "flying over the town on a big soft cloud",
    "a boat that sailed on a sea of milk",
    "a garden where the flowers could sing",
    "a castle made of sand and shells",
    "a kind dragon who liked to eat cake",
    "riding a whale under the shining stars",
    "a forest where every tree had a door",
    "a train that went all the way to the moon",
    "a parade of dancing animals",
    "a big party with all of {his} friends",
]

BEDTIME_HELPS = [
    "read a story about a little boat",
    "sang a soft song",
    "told a story about a sleepy bear",
    "opened the curtain so {he} could see the stars",
    "tucked the blanket in tight",
    "left the door open a little bit",
    "gave {him} a warm glass of milk",
    "turned on a small night light",
]
