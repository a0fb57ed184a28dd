"""Names shared across the package that must not pull in the model stack (the CLI reads them at start-up).

EMBEDDED_DEFAULT is the base model shipped with the project (`workbench.models` loads it); the
commands' --model defaults, the recipe schema and the error messages that give an example name
all read it from here.
"""

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
