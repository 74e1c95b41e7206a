"""Word lists and templates that `prompts.py` fills in (data only)."""

STDLIB_MODULES = [
    "os", "os.path", "sys", "json", "re", "math", "statistics", "random", "itertools", "functools",
    "collections", "datetime", "time", "pathlib", "shutil", "subprocess", "string", "textwrap", "csv",
    "heapq", "bisect", "copy", "pickle", "hashlib", "base64", "zipfile", "tarfile", "gzip", "logging",
    "argparse", "unittest", "urllib.parse", "http.client", "socket", "threading", "queue", "asyncio",
    "contextlib", "dataclasses", "enum", "typing", "operator", "decimal", "fractions", "uuid", "glob",
    "fnmatch", "tempfile", "difflib", "calendar", "struct", "array", "sqlite3", "xml.etree.ElementTree",
    "html", "email", "secrets", "inspect", "traceback", "warnings", "weakref", "io", "codecs", "locale",
    "platform", "signal", "select", "shlex", "configparser", "pprint", "timeit", "cmath", "zlib",
]

LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Bash", "SQL", "C", "Rust", "Go", "Java"]

CODE_THINGS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text file",
    "merges two sorted lists", "finds the largest element in a list", "removes duplicates from a list",
    "computes the factorial of n", "returns the n-th Fibonacci number", "parses a CSV file into dictionaries",
    "checks whether a string is a palindrome", "flattens a nested list", "sorts a list of dictionaries by a key",
    "converts Celsius to Fahrenheit", "reads a JSON file and prints its keys", "computes the average of numbers",
    "finds common elements of two lists", "validates an email address", "counts vowels in a string",
    "implements binary search", "implements a stack class", "implements a simple queue",
    "downloads nothing but builds a URL with query parameters", "renames every .txt file in a folder",
    "computes the greatest common divisor", "generates a random password", "transposes a matrix",
    "groups words by their first letter", "returns the k most frequent items", "chunks a list into pieces of size n",
    "checks whether two strings are anagrams", "converts a Roman numeral to an integer", "computes a running sum",
    "finds the second largest number", "capitalises every word in a sentence", "measures how long a function takes",
]

CODE_TASKS = [
    "Write a {lang} function that {thing}.",
    "How do I write code in {lang} that {thing}?",
    "Write a short {lang} program that {thing}, with comments.",
    "Give me a {lang} example that {thing}, and explain it briefly.",
    "Write a Python function that {thing}. Include a docstring and a test.",
    "Explain step by step how to write a function that {thing}.",
    "What is the time complexity of a function that {thing}? Show code.",
    "Write a Python class with {n} methods; one of them {thing}.",
    "Fix this approach: my code that {thing} is too slow. How can I make it faster?",
]

CODE_DOC_TEMPLATES = [
    "Explain what `{name}` does in Python, with an example.",
    "Show me how to use `{name}` in Python.",
    "The Python documentation says `{name}` will: {doc}. What does that mean?",
    "Write a small Python script that uses `{name}`.",
    "When would I use `{name}` in Python?",
]

CODE_SNIPPET_TEMPLATES = [
    "What does this Python code do?\n```python\n{code}\n```",
    "Explain this function line by line:\n```python\n{code}\n```",
    "Add comments to this code:\n```python\n{code}\n```",
    "Can you simplify this Python code?\n```python\n{code}\n```",
]

MATH_TEMPLATES = [
    "What is {a} + {b}?", "What is {a} times {b}?", "What is {c} minus {a}?", "What is {c} divided by {a}?",
    "Solve for x: {a}x + {b} = {c}.", "What is {p}% of {c}?", "Is {c} a prime number? Explain.",
    "{name} has {c} {item}s and gives away {a}. How many are left?",
    "A store sells {item}s for ${a} each. How much do {b} {item}s cost?",
    "{name} reads {a} pages a day. How many days to finish a {c}-page book?",
    "What is the area of a {shape} with side {a} cm?", "Convert {d} {unit} to a different unit and explain.",
    "What is the square root of {c}, approximately?", "Simplify the fraction {a}/{c}.",
    "A train travels {c} km in {a} hours. What is its average speed?",
    "If a shirt costs ${c} and is {p}% off, what is the sale price?",
    "What is the least common multiple of {a} and {b}?", "What is the greatest common divisor of {a} and {b}?",
    "Explain how to compute {a} squared plus {b} squared.", "Round {d} to the nearest whole number and explain why.",
    "{name} saves ${a} every week. How much after {b} weeks?", "What is the perimeter of a {shape} with side {b} m?",
    "Solve step by step: ({a} + {b}) * {p}.", "Write {c} in binary.",
]

ITEMS = ["apple", "pencil", "book", "cookie", "ticket", "marble", "sticker", "orange", "notebook", "cupcake"]
NAMES = ["Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Mia", "Omar"]
UNITS = ["kilometers", "miles", "kilograms", "pounds", "liters", "meters", "hours", "degrees Celsius"]
SHAPES = ["square", "regular hexagon", "equilateral triangle", "cube", "regular pentagon"]

FORMS = ["poem", "short story", "haiku", "limerick", "letter", "email", "product description", "speech",
         "blog post", "diary entry", "dialogue", "song chorus", "tweet", "review", "fable", "news headline and lead"]
SUBJECTS = [
    "the sea", "autumn leaves", "a lost cat", "the first day of school", "a rainy city", "friendship",
    "a robot learning to paint", "the moon", "a small bakery", "climbing a mountain", "a forgotten library",
    "coffee in the morning", "a dragon who is afraid of fire", "the last train home", "a garden in spring",
    "a grandmother's recipe", "space travel", "a village festival", "the desert at night", "learning to swim",
    "a new job", "an old bicycle", "the wind", "a snowy cabin", "a time traveller", "a lighthouse keeper",
    "a football match", "a busy kitchen", "a quiet forest", "a birthday surprise", "moving to a new city",
]
AUDIENCES = ["a child", "a beginner", "a high-school student", "an expert", "my grandmother", "a new employee"]
TONES = ["funny", "serious", "warm", "formal", "hopeful", "mysterious", "calm"]

WRITING_TEMPLATES = [
    "Write a {form} about {subject}.", "Write a {tone} {form} about {subject}.",
    "Write a {form} about {subject} for {audience}.", "Write a short {form} about {subject} in a {tone} tone.",
    "Write the opening paragraph of a novel about {subject}.", "Describe {subject} in five vivid sentences.",
    "Write a {tone} thank-you note to a teacher.", "Write a {form} that starts with the words 'It was late'.",
]

TOPICS = [
    "photosynthesis", "gravity", "the water cycle", "black holes", "the French Revolution", "democracy",
    "inflation", "the immune system", "volcanoes", "climate change", "the Roman Empire", "electricity",
    "DNA", "the internet", "machine learning", "plate tectonics", "the Renaissance", "vaccines",
    "the solar system", "supply and demand", "the printing press", "evolution", "earthquakes", "rainbows",
    "the human heart", "recycling", "the stock market", "magnets", "the Moon landing", "tides",
    "the Great Wall of China", "ancient Egypt", "the theory of relativity", "antibiotics", "nutrition",
    "sleep", "the Industrial Revolution", "bees", "coral reefs", "the ozone layer", "computers",
    "encryption", "renewable energy", "the Olympic Games", "the Amazon rainforest", "sound waves",
    "compound interest", "the periodic table", "operating systems", "databases", "public speaking",
    "the Silk Road", "glaciers", "the Pythagorean theorem", "probability", "light", "batteries",
]

KNOWLEDGE_TEMPLATES = [
    "Explain {topic} in simple terms.", "What is {topic}?", "Explain {topic} to {audience}.",
    "Why is {topic} important?", "Give a short overview of {topic}.", "What are the main ideas behind {topic}?",
    "How does {topic} work?", "Tell me three interesting facts about {topic}.", "Summarise the history of {topic}.",
    "What are common misconceptions about {topic}?",
]

MAN_TEMPLATES = [
    "What does the `{cmd}` command do on Linux?", "How do I use the `{cmd}` command?",
    "Explain the Linux command `{cmd}` ({desc}).", "Give an example of using `{cmd}` in a terminal.",
    "The manual says `{cmd}` is used to {desc}. When would I need that?",
]

LIST_THINGS = [
    "fruits that are high in vitamin C", "countries in South America", "programming languages", "board games",
    "famous painters", "healthy breakfast ideas", "indoor hobbies", "animals that live in the ocean",
    "musical instruments", "classic novels", "things to pack for a beach trip", "ways to save money",
    "common kitchen tools", "types of clouds", "renewable energy sources", "Linux commands", "birds",
    "Python libraries for data science", "team-building activities", "vegetables that grow fast",
    "ways to reduce stress", "tips for better sleep", "interview questions", "names for a pet dog",
    "science fair project ideas", "reasons to learn a language", "uses for baking soda", "planets",
]
ACTIVITIES = [
    "learning to cook", "running a marathon", "studying for exams", "working from home", "starting a garden",
    "learning guitar", "writing a CV", "travelling on a budget", "learning to code", "keeping a journal",
    "public speaking", "making new friends", "staying focused", "moving house", "learning to draw",
]
LIST_TEMPLATES = [
    "List {n} {things}.", "Name {n} {things}.", "Give me {n} tips for {activity}.",
    "What are {n} good {things}?", "Make a numbered list of {n} {things}.", "List {n} facts about {topic}.",
    "Give me a checklist for {activity}.", "List the pros and cons of {activity}.",
    "What are {n} steps to get started with {activity}?", "Give me {n} questions to ask about {topic}.",
]

EMOTIONS = ["nervous", "excited", "tired", "bored", "stressed", "happy", "lonely", "confused"]
SITUATIONS = [
    "a job interview tomorrow", "my exams", "a long flight", "meeting my partner's parents", "a new city",
    "a disagreement with a friend", "a presentation at work", "starting university", "a rainy weekend",
]
CHAT_TEMPLATES = [
    "Hi! How are you today?", "I'm feeling {emotion} about {situation}. Any advice?",
    "Can you recommend something fun to do on {situation}?", "What do you think about {subject}?",
    "Tell me a joke about {subject}.", "I want to get into {activity}. Where should I start?",
    "My friend {name} is {emotion}. How can I cheer them up?", "What's a good way to spend a free afternoon?",
    "Can you help me plan my day? I have {situation}.", "Who are you, and what can you do?",
    "I just finished {activity}! What should I try next?", "Do you have any advice about {situation}?",
    "Tell me something interesting about {subject}.", "Hello! Can we chat about {subject}?",
    "I'm {emotion}. Can you talk with me for a bit?", "What would you name a cat that loves {subject}?",
]
