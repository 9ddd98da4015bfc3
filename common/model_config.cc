// Placeholder translation unit; the parser lands with the config work.
#include "common/model_config.h"
