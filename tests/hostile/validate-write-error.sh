# The report cannot be written (a full device): exit 1, not a usage error.
EXPECT=1 MESSAGE="^validate: standard output: write error"
setup() { :; }
run() { validate "$FIX/ref" >/dev/full; }
