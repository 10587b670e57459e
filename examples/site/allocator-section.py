"""Print the allocator section of /etc/kelvin/kelvin.yaml: the hall file and, for every hall
node in index order, the sensors its power and inlet temperature are measured by.

Nodes here are cn001..cn200, filled row by row, rack by rack, from the bottom slot up (the
hall file's index order: row * 50 + rack * 5 + slot); their BMCs name the sensors as below.
Edit NODE and SENSORS for your site, then:

    python3 allocator-section.py >> /etc/kelvin/kelvin.yaml
"""

ROWS, RACKS, SLOTS = 4, 10, 5
HALL_FILE = "/etc/kelvin/hall.yaml"
SENSORS = {"power": "ipmi/local/PS1_Input_Power", "inlet_temp": "ipmi/local/Inlet_Temp"}


def node(index: int) -> str:
    """The host name of the node at hall index ``index``."""
    return f"cn{index + 1:03d}"


print("allocator:")
print(f"  hall_file: {HALL_FILE}")
print("  sensor_map:")
for quantity, sensor in SENSORS.items():
    print(f"    {quantity}:")
    for i in range(ROWS * RACKS * SLOTS):
        print(f"      - /{node(i)}/{sensor}")
