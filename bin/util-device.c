/* util-device.c: --device parsing and resolution for the programs that
 * compute (util-device.h). */
#include "util.h"
#include "util-device.h"

int device_parse(const char *usage, const char *s)
{
	int dev;
	if (x3_device_parse(s, &dev))
		usage_error(usage, "--device: '%s' is not cpu, cuda or auto", s);
	return dev;
}

int device_resolve(int want)
{
	int dev;
	if (want == X3_DEVICE_CUDA && !x3_gpu_available())
		die("--device cuda: %s", x3_errmsg());
	if (x3_device_resolve(want, &dev))
		die("--device %s: %s", x3_device_name(want), x3_errmsg());
	if (want == X3_DEVICE_AUTO && dev == X3_DEVICE_CPU && !quiet)
		warnx("--device auto: %s; running on the CPU", x3_errmsg());
	return dev;
}
