# A FIFO in place of quantize_config.json: the reader check names the rule
# it breaks instead of waiting for a writer.
EXPECT=1 MESSAGE="^gptqmodel: quantize_config.json: tensor_storage: no non-empty"
setup() { pack p && rm p/quantize_config.json && mkfifo p/quantize_config.json; }
run() { exl3-info --check gptqmodel p >&2; }
